#include "transport/batch_progress.h"

#include <fmt/format.h>

#include <thread>

namespace kvferry {

BatchProgress::BatchProgress(std::shared_ptr<PeerLiveness> peer, std::chrono::milliseconds timeout)
    : peer_(std::move(peer)),
      start_(Clock::now()),
      timeout_(timeout),
      deadline_(start_ + timeout) {}

Status BatchProgress::stop_reason() const {
  if (stopped_.load()) {
    std::lock_guard lock(mu_);
    return stopped_with_;
  }
  if (peer_->is_disconnected()) {
    return PeerDisconnected("peer " + peer_->name() +
                            " disconnected: " + peer_->disconnect_reason());
  }
  if (Clock::now() >= deadline_) {
    return Timeout(fmt::format("batch exceeded its timeout of {} ms", timeout_.count()));
  }
  return Status::Ok();
}

void BatchProgress::set_work(uint64_t ops_submitted, uint64_t ops_posted, uint64_t bytes,
                             std::vector<RegionUse*> pins) {
  ops_submitted_ = ops_submitted;
  ops_posted_ = ops_posted;
  bytes_ = bytes;
  pins_ = std::move(pins);
}

void BatchProgress::release_pins() {
  if (pins_released_.exchange(true)) return;
  for (RegionUse* use : pins_) use->in_flight.fetch_sub(1);
}

void BatchProgress::finalize_locked(const Status& status) {
  if (state_ != BatchState::kPending) return;
  state_ = status.ok() ? BatchState::kCompleted : BatchState::kFailed;
  error_ = status;
  complete_time_ = Clock::now() - start_;
  if (report_final_) on_final(status, complete_time_);
  final_.store(true, std::memory_order_release);
  cv_.notify_all();
}

void BatchProgress::finish_task(const Status& task_status) {
  if (!task_status.ok()) {
    std::lock_guard lock(mu_);
    if (first_task_error_.ok()) first_task_error_ = task_status;
  }
  if (pending_tasks_.fetch_sub(1) != 1) return;
  // Unpin before anyone can see the batch final: a waiter may unregister right away.
  release_pins();
  std::lock_guard lock(mu_);
  finalize_locked(first_task_error_);
}

void BatchProgress::mark_posted() {
  std::lock_guard lock(mu_);
  post_time_ = std::max(post_time_, std::chrono::nanoseconds(Clock::now() - start_));
}

void BatchProgress::add_helper(std::shared_ptr<BatchHelper> helper) {
  std::lock_guard lock(mu_);
  helpers_.push_back(std::move(helper));
  has_helpers_.store(true);
}

void BatchProgress::help(Clock::time_point until) {
  for (const auto& h : helpers()) h->help(until);
}

void BatchProgress::collect() {
  for (const auto& h : helpers()) h->collect();
}

std::vector<std::shared_ptr<BatchHelper>> BatchProgress::helpers() const {
  if (!has_helpers_.load()) return {};
  std::lock_guard lock(mu_);
  return helpers_;
}

void BatchProgress::stop(const Status& why) {
  {
    std::lock_guard lock(mu_);
    if (stopped_with_.ok()) stopped_with_ = why;
  }
  stopped_.store(true);
  // A copier takes its CopyGuard before it asks stop_reason(), so once the count is zero
  // here no copy can start. Copies are chunked, so this wait is short.
  while (active_copies_.load() != 0) std::this_thread::yield();
  while (wire_in_flight_.load() != 0 && Clock::now() < deadline_) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // A sender that read the batch's memory for a request still on the wire holds a
  // CopyGuard across each syscall and checks the deadline under it (tcp): once the deadline
  // passed and no guard is held, none of them reads that memory again.
  while (active_copies_.load() != 0) std::this_thread::yield();
  // Requests still in the peer's hands past the deadline land nothing more, but a sender
  // may still be reading their local memory: the last finish_task unpins it then.
  if (wire_in_flight_.load() == 0) release_pins();
  std::lock_guard lock(mu_);
  finalize_locked(why);
}

BatchStatus BatchProgress::snapshot() const {
  std::lock_guard lock(mu_);
  BatchStatus out;
  out.state = state_;
  out.status = error_;
  out.telemetry.ops_submitted = ops_submitted_;
  out.telemetry.ops_posted = ops_posted_;
  out.telemetry.bytes = bytes_;
  out.telemetry.post_time = post_time_;
  out.telemetry.complete_time = complete_time_;
  return out;
}

void BatchProgress::wait_until(Clock::time_point until) const {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, until, [&] { return state_ != BatchState::kPending; });
}

}  // namespace kvferry
