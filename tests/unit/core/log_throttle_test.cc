// LogThrottle under a flood: one line per interval, the first at once, and the next line
// counts what was not logged.
#include "core/log_throttle.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

using namespace std::chrono_literals;

TEST(LogThrottle, AFloodOfEventsLetsOneThroughPerIntervalAndCountsTheRest) {
  LogThrottle throttle(1000ms);
  const auto t0 = LogThrottle::Clock::time_point{} + 1h;
  ASSERT_EQ(throttle.admit(t0), std::optional<uint64_t>(0));  // the first: at once
  for (int i = 1; i <= 999; ++i) {
    EXPECT_FALSE(throttle.admit(t0 + std::chrono::microseconds(i * 1000)).has_value()) << i;
  }
  EXPECT_EQ(throttle.admit(t0 + 1000ms), std::optional<uint64_t>(999));
  EXPECT_FALSE(throttle.admit(t0 + 1500ms).has_value());
  EXPECT_EQ(throttle.admit(t0 + 5000ms), std::optional<uint64_t>(1));
  EXPECT_EQ(throttle.admit(t0 + 9000ms), std::optional<uint64_t>(0));  // quiet: at once again
}

}  // namespace
}  // namespace kvferry
