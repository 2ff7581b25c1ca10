// SpinGate: a spell ends at its hot time or on a preempted poll; a preempted poll closes
// the gate for a back-off that doubles while preemption goes on and resets after a clean
// spell.
#include "core/spin_gate.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

using Clock = SpinGate::Clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;

TEST(SpinGate, AnOpenGateSpinsForTheHotTimeThenStops) {
  SpinGate gate;
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(gate.open(t0, microseconds(100)), t0 + microseconds(100));
  EXPECT_TRUE(gate.keep_polling(t0 + microseconds(1), t0 + microseconds(3)));
  EXPECT_TRUE(gate.keep_polling(t0 + microseconds(90), t0 + microseconds(99)));
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(99), t0 + microseconds(101)));
  EXPECT_FALSE(gate.closed(t0 + microseconds(101)));  // the peer was slow: not contention
  EXPECT_EQ(gate.backoff(), Clock::duration::zero());
}

TEST(SpinGate, APreemptedPollClosesTheGateSoTheThreadSleepsAtOnce) {
  SpinGate gate;
  const Clock::time_point t0 = Clock::now();
  gate.open(t0, microseconds(100));
  const Clock::time_point back = t0 + microseconds(10) + SpinGate::kPreemptedGap + microseconds(1);
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(10), back));
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
  EXPECT_TRUE(gate.closed(back));
  EXPECT_EQ(gate.open(back + microseconds(5), microseconds(100)), back + microseconds(5));
  const Clock::time_point reopened = back + SpinGate::kMinBackoff;
  EXPECT_FALSE(gate.closed(reopened));
  EXPECT_EQ(gate.open(reopened, microseconds(100)), reopened + microseconds(100));
}

TEST(SpinGate, TheBackoffDoublesWhileContentionLastsAndResetsAfterACleanSpell) {
  SpinGate gate;
  Clock::time_point t = Clock::now();
  auto preempted_spell = [&] {
    ASSERT_NE(gate.open(t, microseconds(100)), t);  // open again
    const Clock::time_point back = t + milliseconds(3);
    EXPECT_FALSE(gate.keep_polling(t, back));
    t = back + gate.backoff();  // once the back-off is over
  };
  preempted_spell();
  EXPECT_EQ(gate.backoff(), milliseconds(2));
  preempted_spell();
  EXPECT_EQ(gate.backoff(), milliseconds(4));
  for (int i = 0; i < 12; ++i) preempted_spell();
  EXPECT_EQ(gate.backoff(), SpinGate::kMaxBackoff);
  ASSERT_NE(gate.open(t, microseconds(100)), t);
  EXPECT_TRUE(gate.keep_polling(t, t + microseconds(2)));
  gate.settle(t + microseconds(20));  // the answer came
  EXPECT_EQ(gate.backoff(), Clock::duration::zero());
  ASSERT_NE(gate.open(t + milliseconds(1), microseconds(100)), t + milliseconds(1));
  EXPECT_FALSE(gate.keep_polling(t + milliseconds(1), t + milliseconds(2)));
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);  // starts over
}

}  // namespace
}  // namespace kvferry
