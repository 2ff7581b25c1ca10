// LogThrottle: at most one log line per interval for an event that a peer can repeat at will
// (a refused connection, a bad frame, a dropped notification). The first event after a quiet
// interval is logged at once; the ones after it within the interval are only counted, and
// the next line let through says how many were not logged. So a flood costs one line per
// interval, and the first sign of it is never delayed.
//
// Thread-safety: every member from any thread.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "core/logging.h"

namespace kvferry {

inline constexpr std::chrono::milliseconds kLogThrottleInterval{5000};

class LogThrottle {
 public:
  using Clock = std::chrono::steady_clock;

  explicit LogThrottle(std::chrono::milliseconds interval = kLogThrottleInterval)
      : interval_(interval) {}

  // Whether an event at `now` may be logged; if so, how many events were not logged since
  // the last one that was.
  std::optional<uint64_t> admit(Clock::time_point now = Clock::now()) {
    std::lock_guard lock(mu_);
    if (logged_once_ && now < next_) {
      ++suppressed_;
      return std::nullopt;
    }
    logged_once_ = true;
    next_ = now + interval_;
    return std::exchange(suppressed_, 0);
  }

  template <typename... Args>
  void warn(fmt::format_string<Args...> format, Args&&... args) {
    const std::optional<uint64_t> suppressed = admit();
    if (!suppressed) return;
    std::string line = fmt::format(format, std::forward<Args>(args)...);
    if (*suppressed > 0) {
      line += fmt::format(" ({} more like this in the last {} ms were not logged)", *suppressed,
                          interval_.count());
    }
    log().warn("{}", line);
  }

 private:
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  bool logged_once_ = false;  // guarded by mu_
  Clock::time_point next_;    // guarded by mu_: the earliest time the next line may go
  uint64_t suppressed_ = 0;   // guarded by mu_
};

}  // namespace kvferry
