// BatchRecord: the engine's state for one submitted batch — its resolved copy work, its
// progress, and how it ended.
//
// Life cycle: submit creates it with `pending_tasks` work items; each item calls
// finish_task; the last one makes it final (Completed, or the first error). cancel()
// and timeouts make it final early: they set `cancelled`, then wait until no copy is
// running (`active_copies` == 0), so nothing of it lands after they return.
//
// Thread-safety: all members are atomics or guarded by `mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "core/net.h"
#include "engine/op_resolver.h"
#include "engine/peer_state.h"
#include "engine/region_index.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::detail {

// A byte range of a batch's spans that one thread copies.
struct CopySlice {
  size_t first_span = 0;
  uint64_t first_offset = 0;  // bytes of first_span owned by the previous slice
  size_t last_span = 0;       // inclusive
  uint64_t last_end = 0;      // end offset within last_span
};

struct BatchRecord {
  // Immutable after submit.
  ResolvedBatch work;
  std::shared_ptr<PeerLiveness> peer;
  std::shared_ptr<const RegionIndex> local_snapshot;     // keeps RegionUse alive
  std::shared_ptr<const RemoteSegment> remote_snapshot;  // keeps mappings alive
  Clock::time_point start;
  Clock::time_point deadline;
  std::chrono::milliseconds timeout{0};
  uint64_t ops_submitted = 0;
  // Set before posting: who copies slice i first claims it (a worker or a waiter).
  std::vector<CopySlice> slices;
  std::unique_ptr<std::atomic<bool>[]> slice_claimed;

  std::atomic<int> pending_tasks{0};
  std::atomic<int> active_copies{0};
  // Requests on the wire (tcp) not yet acknowledged, or copies enqueued on a device
  // (cuda_ipc) not yet done: stop() waits for them, or for the deadline, after which the
  // receiver writes nothing of this batch (tcp; a device stalled past the deadline, e.g.
  // behind an after_cuda_event that never fires, may still land its copies later).
  std::atomic<int> wire_in_flight{0};
  std::atomic<bool> cancelled{false};
  std::atomic<bool> uses_released{false};

  mutable std::mutex mu;
  mutable std::condition_variable cv;
  BatchState state = BatchState::kPending;    // guarded by mu
  Status error;                               // guarded by mu
  Status first_task_error;                    // guarded by mu
  Status stop_status;                         // why stop() was called; guarded by mu
  std::chrono::nanoseconds post_time{0};      // guarded by mu
  std::chrono::nanoseconds complete_time{0};  // guarded by mu

  // Records a task's outcome; the last task makes the batch final.
  void finish_task(const Status& task_status);
  // Makes the batch final with `why` unless it already is; returns once no copy of it
  // is running and none will start.
  void stop(const Status& why);
  BatchStatus snapshot() const;
  // The status stop() was called with (a copier that sees `cancelled` reports it).
  Status stop_reason() const;

 private:
  void finalize_locked(const Status& status);
  void release_uses();
};

}  // namespace kvferry::detail
