// CopyExecutor: runs a batch's copy spans with memcpy — the data path of the local and
// shm transports. Small batches run on the submitting thread; larger ones are cut into
// byte-balanced slices, one per worker. Work proceeds in chunks (at most
// kCopyChunkBytes or kCopyChunkSpans); between chunks a copier checks for cancellation,
// the batch deadline and peer death, so every batch ends promptly.
//
// Thread-safety: run() may be called concurrently; the pool is shared.
#pragma once

#include <cstdint>
#include <memory>

#include "core/thread_pool.h"
#include "engine/batch_record.h"

namespace kvferry::detail {

inline constexpr uint64_t kCopyChunkBytes = 4u << 20;
inline constexpr size_t kCopyChunkSpans = 512;

class CopyExecutor {
 public:
  CopyExecutor(ThreadPool& pool, uint64_t inline_bytes)
      : pool_(pool), inline_bytes_(inline_bytes) {}
  // Takes the batch from posted to final (inline) or hands it to workers.
  void run(const std::shared_ptr<BatchRecord>& batch);
  // Copies, on the calling thread, every slice of `batch` no worker has started: a thread
  // that is about to wait for the batch does the work instead of sleeping through a
  // worker's wake-up.
  static void help(BatchRecord& batch);

 private:
  // Claims slice i and copies it; false if someone else had claimed it.
  static bool run_slice(BatchRecord& batch, size_t i);

  ThreadPool& pool_;
  uint64_t inline_bytes_;
};

}  // namespace kvferry::detail
