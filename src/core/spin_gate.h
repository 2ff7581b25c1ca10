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
// So the gate watches each polling spell. Between polls the thread yields its core to any
// thread queued on it, which lets a pair the scheduler put on one core take turns at once. It
// ends the spell, and closes the gate (the thread sleeps at once) for a back-off, when a poll
// (one non-blocking system call, and the yield) took more than kPreemptedGap (the thread lost
// its core meanwhile) or when the spell ran out before anything came. The back-off starts at
// kMinBackoff, short so that a lone hiccup on a quiet machine (a VM pause, a timer) costs only
// a few sleeping waits, and doubles, up to kMaxBackoff, each time the spell after a back-off
// fails again. A spell that brought what it polled for (settle) resets it.
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
  static constexpr std::chrono::microseconds kMinBackoff{250};
  static constexpr std::chrono::milliseconds kMaxBackoff{256};

  // Starts a spell of at most `hot` from `now`, unless the gate is closed.
  void open(Clock::time_point now, Clock::duration hot) {
    spell_end_ = now < closed_until_ ? Clock::time_point{} : now + hot;
    paid_ = false;
  }

  // Whether a spell is on: the thread polls instead of sleeping.
  bool spinning() const { return spell_end_ != Clock::time_point{}; }

  // After a poll that found nothing, begun at `began` and returned at `now`: whether to poll
  // again. False ends the spell: once it is over, or when the thread lost its core during the
  // poll. A preempted poll, or a spell over with nothing come, closes the gate.
  bool keep_polling(Clock::time_point began, Clock::time_point now) {
    bool preempted = now - began > kPreemptedGap;
    if (!preempted && now < spell_end_) {
      // A thread queued on this core runs first (sched_yield returns at once when there is
      // none): often the very peer polled for, woken onto this core by its answer.
      ::sched_yield();
      const Clock::time_point back = Clock::now();
      preempted = back - now > kPreemptedGap;
      if (!preempted) return true;
      now = back;
    }
    if (preempted || !paid_) {
      backoff_ = backoff_ == Clock::duration::zero()
                     ? Clock::duration(kMinBackoff)
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
  Clock::duration backoff() const { return backoff_; }

 private:
  Clock::time_point spell_end_{};  // zero: no spell on
  bool paid_ = false;              // the spell on brought something
  Clock::time_point closed_until_{};
  Clock::duration backoff_{};
};

}  // namespace kvferry
