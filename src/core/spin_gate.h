// SpinGate: whether a thread about to wait for a peer's next move polls for it first, and
// when it stops. Polling beats sleeping only while both ends run: the answer comes sooner
// than a sleeping thread wakes. On a contended CPU the opposite holds: a polling thread uses
// up its time slice and then waits behind the busy processes, while a thread that sleeps is
// woken ahead of them (the scheduler favours sleepers). Measured on 2 cores with one compiler
// beside the bench: a 64 KiB polled round trip took 245 us at p50, the blocking one 34 us;
// kvferry's 64 KiB tcp write with the gate 76 us, without it 273 us (one spinning process
// beside it).
//
// A spell that runs out with nothing to show did not pay either, and on a contended CPU it is
// the costly case: the peer it waits for is often queued behind it on the same core (a
// loopback sender wakes its receiver on its own core), so the poller holds off the very answer
// it polls for until its spell ends. Traced on 2 cores with two busy processes beside the
// bench: 2-7 % of single 4 KiB writes took 110-220 us, the client's spell and then the
// server's each running out while the other waited on that core.
//
// So the gate watches each polling spell. It ends the spell, and closes the gate (the thread
// sleeps at once) for a back-off, when a poll took more than kPreemptedGap (the thread lost its
// core meanwhile) or when the spell ran out before anything came. The back-off doubles, up to
// kMaxBackoff, each time the spell after it fails again; a spell that brought what it polled
// for (settle) resets it.
//
// Between polls the thread yields its core (sched_yield) to any thread queued on it, so two
// ends the scheduler put on one core take turns at once, unless the machine is contended:
// a poll or a yield that lost the core for more than kContendedGap (a busy process's time
// slice, not a peer's turn) in the last kContendedFor. Yielding to a busy process costs the
// rest of its slice, a scheduler tick (4 ms here): 1 run in 4 with two busy processes had
// single-op p99 at 3-4 ms before contention turned yielding off. The first back-off is short
// on a quiet machine (kMinBackoff: a lone hiccup costs a few sleeping waits) and longer on a
// contended one (kContendedBackoff: a failed probe costs the op that made it 100-200 us;
// at 250 us there, p99 was 9-10x p50).
//
// Thread-safety: none; one gate per polling role (a connection's I/O thread, a lane's
// reading role), used by whichever thread holds that role.
#pragma once

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace kvferry {

class SpinGate {
 public:
  using Clock = std::chrono::steady_clock;
  // A poll is one non-blocking system call (a few microseconds): one this long was preempted.
  static constexpr std::chrono::microseconds kPreemptedGap{50};
  static constexpr std::chrono::milliseconds kContendedGap{1};
  static constexpr std::chrono::seconds kContendedFor{1};
  static constexpr std::chrono::microseconds kMinBackoff{250};
  static constexpr std::chrono::milliseconds kContendedBackoff{2};
  static constexpr std::chrono::milliseconds kMaxBackoff{256};

  // Starts a spell of at most `hot` from `now`, unless the gate is closed.
  void open(Clock::time_point now, Clock::duration hot) {
    spell_end_ = now < closed_until_ ? Clock::time_point{} : now + hot;
    paid_ = false;
  }

  // Whether a spell is on: the thread polls instead of sleeping.
  bool spinning() const { return spell_end_ != Clock::time_point{}; }

  // After a poll that found nothing, begun at `began` and returned at `now`: whether to poll
  // again (having yielded the core, unless contended). False ends the spell: once it is over,
  // or when the thread lost its core during the poll or the yield. A preempted poll, or a
  // spell over with nothing come, closes the gate.
  bool keep_polling(Clock::time_point began, Clock::time_point now) {
    bool preempted = lost_core(began, now);
    if (!preempted && now < spell_end_) {
      if (contended(now)) return true;
      ::sched_yield();
      const Clock::time_point back = Clock::now();
      if (!lost_core(now, back)) return true;
      preempted = true;
      now = back;
    }
    if (preempted || !paid_) {
      backoff_ = backoff_ == Clock::duration::zero()
                     ? Clock::duration(contended(now) ? kContendedBackoff : kMinBackoff)
                     : std::min<Clock::duration>(backoff_ * 2, kMaxBackoff);
      closed_until_ = now + backoff_;
    }
    stop();
    return false;
  }

  // The spell on brought what it polled for: polling pays, the back-off starts over. The
  // spell goes on (more may follow); without one, nothing is learned.
  void settle() {
    if (!spinning()) return;
    paid_ = true;
    backoff_ = Clock::duration::zero();
  }

  // Ends the spell unjudged (what came next is not an exchange the gate times).
  void stop() { spell_end_ = Clock::time_point{}; }

  bool closed(Clock::time_point now) const { return now < closed_until_; }
  bool contended(Clock::time_point now) const {
    return contended_at_ != Clock::time_point{} && now - contended_at_ < kContendedFor;
  }
  Clock::duration backoff() const { return backoff_; }

 private:
  // Whether the thread lost its core between `from` and `to` (and for long enough to count as
  // contention: recorded).
  bool lost_core(Clock::time_point from, Clock::time_point to) {
    if (to - from > kContendedGap) contended_at_ = to;
    return to - from > kPreemptedGap;
  }

  Clock::time_point spell_end_{};  // zero: no spell on
  bool paid_ = false;              // the spell on brought something
  Clock::time_point closed_until_{};
  Clock::duration backoff_{};
  Clock::time_point contended_at_{};  // the last core lost for over kContendedGap
};

}  // namespace kvferry
