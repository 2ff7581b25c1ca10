// CopyExecutor: runs a part of a batch with memcpy — the data path of the local and shm
// transports. Small parts run on the submitting thread; larger ones are cut into
// byte-balanced slices, one per worker, and a thread that waits for the batch copies the
// slices no worker has started yet (BatchHelper).
//
// Inline or split is a fixed threshold (EngineOptions::inline_batch_bytes, 2 MiB by
// default), not a probe at engine start: a probe of a few milliseconds on a shared machine
// measures whoever else is running at that moment and fixes the answer for the engine's
// life. Slices are claimed dynamically (about four per worker), so a split is never much
// slower than inline: a worker that wakes late finds only what the waiter left. Measured on
// the 2-core VM of docs/PERFORMANCE.md: at 512 KiB a 1 MiB copy lost (0.5-0.7x) to the
// wake-up of a worker; at 4 MiB with 2 threads the split wins (1.04x against 0.94x inline).
//
// CopyLink: the TransportLink of both memcpy transports (the peer's memory is mapped here).
//
// ChunkCopier: the copy step of a transport that moves the same chunks another way (cma:
// process_vm_writev/readv). Without one, a chunk is copied with memmove, exactly as before.
//
// Thread-safety: run() may be called concurrently; the pool is shared.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/thread_pool.h"
#include "transport/transport.h"

namespace kvferry {

inline constexpr uint64_t kCopyChunkBytes = 4u << 20;
inline constexpr size_t kCopyChunkSpans = 512;

// Bytes [offset, offset + length) of one span: a piece of a chunk.
struct CopyPiece {
  const ResolvedOp* span = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
};
// The most pieces one chunk has: kCopyChunkSpans whole spans and a partial one.
inline constexpr size_t kMaxChunkPieces = kCopyChunkSpans + 1;

class ChunkCopier {
 public:
  virtual ~ChunkCopier() = default;
  // Copies every piece of one chunk (called with the batch's CopyGuard held, after its
  // stop_reason() was OK), or says why not. Called concurrently, one chunk per thread.
  virtual Status copy_chunk(std::span<const CopyPiece> pieces) const = 0;
};

class CopyExecutor {
 public:
  // `copier` null: memmove.
  CopyExecutor(ThreadPool& pool, uint64_t inline_bytes,
               std::shared_ptr<const ChunkCopier> copier = nullptr)
      : pool_(pool), inline_bytes_(inline_bytes), copier_(std::move(copier)) {}
  // Takes the part from posted to finished (inline) or hands it to workers.
  void run(const BatchPart& part);

 private:
  ThreadPool& pool_;
  uint64_t inline_bytes_;
  std::shared_ptr<const ChunkCopier> copier_;
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
