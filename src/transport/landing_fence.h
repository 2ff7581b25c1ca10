// Landing windows: the spans in which a receiving thread of this process may write a peer's
// bytes into registered memory (a tcp I/O thread's receive or copy, a staged device copy,
// ucx's copy from its landing buffer). Each is opened before the deadline check that admits
// the bytes and closed once they are in place. wait_for_landings() returns once every window
// that was open when it was called has closed.
//
// Why: a receiver begins to land a write no later than kLandingMarginNs before its deadline,
// so the landing is normally over before the initiator reports Timeout; a thread descheduled
// between its check and the end of its copy could still land after that. A target that
// learns a request failed calls wait_for_landings() before it reuses the request's memory.
// Then nothing admitted earlier is still landing, and anything admitted later was checked
// against a deadline that had passed (a request aborted before its deadline: its initiator
// had every frame answered before it acknowledged the abort).
//
// Cost: two stores to the thread's own slot per window, the opening one sequentially
// consistent (the deadline check that follows must not be reordered before it).
// Thread-safety: a window belongs to the thread that opened it (windows nest: only the
// outermost counts); wait_for_landings() may be called from any thread, and skips a window
// of its own thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvferry {

class LandingWindow {
 public:
  LandingWindow();
  ~LandingWindow();
  LandingWindow(const LandingWindow&) = delete;
  LandingWindow& operator=(const LandingWindow&) = delete;

 private:
  std::atomic<uint64_t>* seq_;  // this thread's slot; nullptr for a nested window
};

// Waits until every landing window open at the call (on another thread) has closed. Bounded
// by the landings themselves: each is one receive of at most a piece, or one copy, never a
// wait for a peer. `found`, when set, is told how many open windows the call waits for, before
// it waits (tests use it to know the wait has begun).
void wait_for_landings(const std::function<void(size_t open)>& found = {});

}  // namespace kvferry
