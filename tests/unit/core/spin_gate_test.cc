// SpinGate: a spell ends at its hot time or on a preempted poll; a preempted poll, or a spell
// that ran out with nothing come, closes the gate for a back-off that doubles while spells keep
// failing and resets once one brings what it polled for. A core lost for over a millisecond
// marks the machine contended: no yielding between polls, and a longer first back-off.
//
// The tests' times start an hour ahead of the clock: keep_polling reads the clock after it
// yields, and a real time behind the given one never counts as a lost core, however slowly the
// test runs (sanitizers, a loaded machine).
#include "core/spin_gate.h"

#include <gtest/gtest.h>

namespace kvferry {
namespace {

using Clock = SpinGate::Clock;
using std::chrono::hours;
using std::chrono::microseconds;
using std::chrono::milliseconds;

Clock::time_point ahead() { return Clock::now() + hours(1); }

TEST(SpinGate, ASpellThatBringsSomethingPollsUntilItsHotTimeAndKeepsTheGateOpen) {
  SpinGate gate;
  const Clock::time_point t0 = ahead();
  gate.open(t0, microseconds(100));
  EXPECT_TRUE(gate.spinning());
  EXPECT_TRUE(gate.keep_polling(t0 + microseconds(1), t0 + microseconds(3)));
  gate.settle();  // the answer came; more of it may follow
  EXPECT_TRUE(gate.keep_polling(t0 + microseconds(90), t0 + microseconds(99)));
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(99), t0 + microseconds(101)));
  EXPECT_FALSE(gate.spinning());
  EXPECT_FALSE(gate.closed(t0 + microseconds(101)));
  EXPECT_EQ(gate.backoff(), Clock::duration::zero());
}

// Starvation of the peer on a shared core: the poller holds the core its answer needs, so the
// spell runs out empty. Polling again next time would cost the same.
TEST(SpinGate, ASpellThatRunsOutWithNothingClosesTheGate) {
  SpinGate gate;
  const Clock::time_point t0 = ahead();
  gate.open(t0, microseconds(100));
  EXPECT_TRUE(gate.keep_polling(t0 + microseconds(95), t0 + microseconds(99)));
  const Clock::time_point over = t0 + microseconds(101);
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(99), over));
  EXPECT_FALSE(gate.spinning());
  EXPECT_TRUE(gate.closed(over));
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
  gate.open(over + microseconds(5), microseconds(100));
  EXPECT_FALSE(gate.spinning());  // sleeps at once
}

// A peer's turn on this core, or a VM's pause: the thread lost its core briefly.
TEST(SpinGate, APreemptedPollClosesTheGateSoTheThreadSleepsAtOnce) {
  SpinGate gate;
  const Clock::time_point t0 = ahead();
  gate.open(t0, microseconds(100));
  gate.settle();  // even a spell that paid ends when the thread loses its core
  const Clock::time_point back = t0 + microseconds(10) + SpinGate::kPreemptedGap + microseconds(1);
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(10), back));
  EXPECT_FALSE(gate.contended(back));
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
  EXPECT_TRUE(gate.closed(back));
  gate.open(back + microseconds(5), microseconds(100));
  EXPECT_FALSE(gate.spinning());
  const Clock::time_point reopened = back + SpinGate::kMinBackoff;
  EXPECT_FALSE(gate.closed(reopened));
  gate.open(reopened, microseconds(100));
  EXPECT_TRUE(gate.spinning());
}

// Contention: a busy process took the core for its time slice. Yielding to it would cost the
// rest of that slice, and probing again soon would cost another.
TEST(SpinGate, ACoreLostForATimeSliceMarksContentionForASecond) {
  SpinGate gate;
  const Clock::time_point t0 = ahead();
  gate.open(t0, microseconds(100));
  const Clock::time_point back = t0 + SpinGate::kContendedGap + microseconds(1);
  EXPECT_FALSE(gate.keep_polling(t0, back));
  EXPECT_TRUE(gate.contended(back));
  EXPECT_EQ(gate.backoff(), SpinGate::kContendedBackoff);
  const Clock::time_point later = back + gate.backoff();
  gate.open(later, microseconds(100));
  ASSERT_TRUE(gate.spinning());
  EXPECT_TRUE(gate.keep_polling(later, later + microseconds(2)));  // polls, without yielding
  gate.settle();
  EXPECT_TRUE(gate.contended(back + SpinGate::kContendedFor - microseconds(1)));
  EXPECT_FALSE(gate.contended(back + SpinGate::kContendedFor));
  const Clock::time_point calm = back + SpinGate::kContendedFor + microseconds(1);
  gate.open(calm, microseconds(100));
  EXPECT_FALSE(gate.keep_polling(calm, calm + microseconds(101)));  // ran out
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
}

TEST(SpinGate, TheBackoffDoublesWhileSpellsFailAndResetsAfterOneThatPays) {
  SpinGate gate;
  Clock::time_point t = ahead();
  auto failed_spell = [&](bool preempted) {
    gate.open(t, microseconds(100));
    ASSERT_TRUE(gate.spinning());  // open again
    const Clock::time_point back = t + (preempted ? microseconds(60) : microseconds(101));
    EXPECT_FALSE(gate.keep_polling(preempted ? t : back - microseconds(2), back));
    t = back + gate.backoff();  // once the back-off is over
  };
  failed_spell(true);
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
  failed_spell(false);
  EXPECT_EQ(gate.backoff(), 2 * SpinGate::kMinBackoff);
  for (int i = 0; i < 12; ++i) failed_spell(i % 2 == 0);
  EXPECT_EQ(gate.backoff(), SpinGate::kMaxBackoff);
  gate.open(t, microseconds(100));
  EXPECT_TRUE(gate.keep_polling(t, t + microseconds(2)));
  gate.settle();  // the answer came
  EXPECT_EQ(gate.backoff(), Clock::duration::zero());
  gate.open(t + milliseconds(1), microseconds(100));
  ASSERT_TRUE(gate.spinning());
  EXPECT_FALSE(gate.keep_polling(t + milliseconds(1), t + milliseconds(1) + microseconds(101)));
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);  // starts over
}

// Without a spell on, input says nothing of whether polling would pay: a failing gate keeps
// its back-off until a spell of its own brings something.
TEST(SpinGate, InputThatCameWhileAsleepDoesNotResetTheBackoff) {
  SpinGate gate;
  const Clock::time_point t0 = ahead();
  gate.open(t0, microseconds(100));
  EXPECT_FALSE(gate.keep_polling(t0 + microseconds(99), t0 + microseconds(101)));
  gate.settle();  // a request that woke the sleeping thread
  EXPECT_EQ(gate.backoff(), SpinGate::kMinBackoff);
  gate.stop();
  EXPECT_FALSE(gate.spinning());
}

}  // namespace
}  // namespace kvferry
