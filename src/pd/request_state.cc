#include "kvferry/pd/request_state.h"

namespace kvferry::pd {

std::string_view request_state_name(RequestState state) {
  switch (state) {
    case RequestState::kFailed: return "Failed";
    case RequestState::kBootstrapping: return "Bootstrapping";
    case RequestState::kWaitingForInput: return "WaitingForInput";
    case RequestState::kTransferring: return "Transferring";
    case RequestState::kSuccess: return "Success";
  }
  return "Unknown";
}

RequestState RequestStatusCell::state() const {
  std::lock_guard lock(mu_);
  return state_;
}

Status RequestStatusCell::failure() const {
  std::lock_guard lock(mu_);
  return reason_;
}

bool RequestStatusCell::advance(RequestState to) {
  if (to == RequestState::kFailed) return false;
  std::lock_guard lock(mu_);
  if (is_final(state_) || to <= state_) return false;
  state_ = to;
  cv_.notify_all();
  return true;
}

bool RequestStatusCell::fail(Status reason) {
  if (reason.ok()) reason = Internal("request failed without a reason");
  std::lock_guard lock(mu_);
  if (is_final(state_)) return false;
  state_ = RequestState::kFailed;
  reason_ = std::move(reason);
  cv_.notify_all();
  return true;
}

RequestState RequestStatusCell::wait_final(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return is_final(state_); });
  return state_;
}

RequestState RequestStatusCell::wait_at_least(RequestState at_least,
                                              std::chrono::milliseconds timeout) const {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return is_final(state_) || state_ >= at_least; });
  return state_;
}

}  // namespace kvferry::pd
