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

}  // namespace kvferry
