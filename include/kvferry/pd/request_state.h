// RequestState and RequestStatusCell: the per-request status both sides of a PD transfer
// report, ordered Failed < Bootstrapping < WaitingForInput < Transferring < Success.
//
// The order is the contract: a status only moves forward, Success and Failed are final, and
// Failed is sticky and carries the reason (a typed Status). A sender or receiver that meets
// a problem of any kind (timeout, dead peer, abort, transfer error) ends in Failed with a
// reason, never in a hang.
//
// Thread-safety: RequestStatusCell is safe to use from any number of threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry::pd {

enum class RequestState : uint8_t {
  kFailed = 0,
  kBootstrapping,    // finding the peer (decode) or waiting for decode's destination (prefill)
  kWaitingForInput,  // peer known; waiting for the caller (decode: pages; prefill: chunks)
  kTransferring,     // pages are moving
  kSuccess,          // every page (and the aux row and state) is in decode's memory
};

inline constexpr RequestState kMaxRequestState = RequestState::kSuccess;

// "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success".
std::string_view request_state_name(RequestState state);

inline bool is_final(RequestState state) {
  return state == RequestState::kFailed || state == RequestState::kSuccess;
}

class RequestStatusCell {
 public:
  explicit RequestStatusCell(RequestState initial = RequestState::kBootstrapping)
      : state_(initial) {}

  RequestState state() const;
  // The reason when Failed; OK otherwise.
  Status failure() const;

  // Moves forward to `to` (a non-final or Success state). Returns false, changing nothing,
  // when the cell is final or `to` is not past the current state.
  bool advance(RequestState to);
  // Moves to Failed with `reason` (must not be OK). Returns false when already final: the
  // first final state wins and Failed keeps its first reason.
  bool fail(Status reason);

  // Waits until the state is final or `timeout` passes; returns the state then.
  RequestState wait_final(std::chrono::milliseconds timeout) const;
  // Waits until the state is at least `at_least` or final; returns the state then.
  RequestState wait_at_least(RequestState at_least, std::chrono::milliseconds timeout) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  RequestState state_;
  Status reason_;
};

}  // namespace kvferry::pd
