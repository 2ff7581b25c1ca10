// CopyExecutor: runs a part of a batch with memcpy — the data path of the local and shm
// transports. Small parts run on the submitting thread; larger ones are cut into
// byte-balanced slices, one per worker, and a thread that waits for the batch copies the
// slices no worker has started yet (BatchHelper). Work proceeds in chunks (at most
// kCopyChunkBytes or kCopyChunkSpans); between chunks a copier asks the batch's
// stop_reason(), so every batch ends promptly after a cancel, a timeout or a peer's death.
//
// CopyLink: the TransportLink of both memcpy transports (the peer's memory is mapped here).
//
// Thread-safety: run() may be called concurrently; the pool is shared.
#pragma once

#include <cstdint>
#include <memory>

#include "core/thread_pool.h"
#include "transport/transport.h"

namespace kvferry {

inline constexpr uint64_t kCopyChunkBytes = 4u << 20;
inline constexpr size_t kCopyChunkSpans = 512;

class CopyExecutor {
 public:
  CopyExecutor(ThreadPool& pool, uint64_t inline_bytes)
      : pool_(pool), inline_bytes_(inline_bytes) {}
  // Takes the part from posted to finished (inline) or hands it to workers.
  void run(const BatchPart& part);

 private:
  ThreadPool& pool_;
  uint64_t inline_bytes_;
};

class CopyLink final : public TransportLink {
 public:
  explicit CopyLink(std::shared_ptr<CopyExecutor> copier) : copier_(std::move(copier)) {}
  Status post(const BatchPart& part) override {
    copier_->run(part);
    return Status::Ok();
  }

 private:
  std::shared_ptr<CopyExecutor> copier_;
};

// What both memcpy transports share: host pointers on both sides, copies that may run on
// the submitting thread, and a CopyLink per peer over one executor. They differ in reach
// (why_not) and in whether the peer's memory must be mapped here.
class CopyTransport : public Transport {
 public:
  CopyTransport(const TransportEnv& env, bool maps_remote_host_memory)
      : copier_(std::make_shared<CopyExecutor>(*env.workers, env.inline_batch_bytes)),
        maps_remote_host_memory_(maps_remote_host_memory) {}
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kHostPointers;
    caps.maps_remote_host_memory = maps_remote_host_memory_;
    caps.may_copy_in_post = true;
    return caps;
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo&) override {
    return std::shared_ptr<TransportLink>(std::make_shared<CopyLink>(copier_));
  }

 private:
  std::shared_ptr<CopyExecutor> copier_;
  bool maps_remote_host_memory_;
};

}  // namespace kvferry
