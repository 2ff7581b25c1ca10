#include "engine/batch_record.h"

#include <thread>

namespace kvferry::detail {

void BatchRecord::release_uses() {
  if (uses_released.exchange(true)) return;
  for (RegionUse* use : work.uses) use->in_flight.fetch_sub(1);
}

void BatchRecord::finalize_locked(const Status& status) {
  if (state != BatchState::kPending) return;
  state = status.ok() ? BatchState::kCompleted : BatchState::kFailed;
  error = status;
  complete_time = Clock::now() - start;
  cv.notify_all();
}

void BatchRecord::finish_task(const Status& task_status) {
  if (!task_status.ok()) {
    std::lock_guard lock(mu);
    if (first_task_error.ok()) first_task_error = task_status;
  }
  if (pending_tasks.fetch_sub(1) != 1) return;
  // Unpin before anyone can see the batch final: a waiter may unregister right away.
  release_uses();
  std::lock_guard lock(mu);
  finalize_locked(first_task_error);
}

void BatchRecord::stop(const Status& why) {
  {
    std::lock_guard lock(mu);
    if (stop_status.ok()) stop_status = why;
  }
  cancelled.store(true);
  // A copier increments active_copies before it checks `cancelled`, so once the count
  // is zero here no copy can start. Copies are chunked, so this wait is short.
  while (active_copies.load() != 0) std::this_thread::yield();
  while (wire_in_flight.load() != 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Requests still on the wire past the deadline land nothing more, but a sender may still
  // be reading their local memory: the last finish_task unpins it then.
  if (wire_in_flight.load() == 0) release_uses();
  std::lock_guard lock(mu);
  finalize_locked(why);
}

Status BatchRecord::stop_reason() const {
  std::lock_guard lock(mu);
  return stop_status;
}

BatchStatus BatchRecord::snapshot() const {
  std::lock_guard lock(mu);
  BatchStatus out;
  out.state = state;
  out.status = error;
  out.telemetry.ops_submitted = ops_submitted;
  out.telemetry.ops_posted = work.spans.size();
  out.telemetry.bytes = work.bytes;
  out.telemetry.post_time = post_time;
  out.telemetry.complete_time = complete_time;
  return out;
}

}  // namespace kvferry::detail
