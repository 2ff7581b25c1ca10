// IoPool: worker threads that wait together on one epoll set and run what becomes ready: a
// posted task, a watched descriptor that turned readable (or closed), the timer. The worker
// the kernel wakes runs it itself, so an event costs one wake-up, as a thread of its own
// blocked on that descriptor would; but a descriptor nobody reads costs no thread.
//
// Workers are started on demand: when a worker takes an event and none is left waiting, it
// starts another first (up to max_threads), so a callback that blocks (a receive mid-frame,
// a send to a full socket) holds up nothing else. A worker beyond `keep` that waits idle for
// idle_exit ends. The threads are so as many as the callbacks running at once, plus one.
//
// A watch fires once per arm() (EPOLLONESHOT): its owner re-arms it when it wants to hear of
// the descriptor again. The timer runs `tick` on one worker at the time it last asked for,
// or earlier when wake_timer_by() asks for earlier.
//
// Thread-safety: every method may be called from any thread, a worker's included. The pool
// may be destroyed on one of its own workers (the last owner of what owns it may be one of
// its callbacks); tasks still queued then run before the workers end.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kvferry/status.h"

namespace kvferry {

class IoPool {
  struct State;

 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    std::string name = "kvf-io";  // worker i is named `name`-i
    int keep = 1;                 // workers kept while idle
    int max_threads = 1024;
    std::chrono::milliseconds idle_exit{2000};
  };

  // Holds a descriptor in the pool's epoll set while it lives; destroy it before closing the
  // descriptor. A callback already taken by a worker may still run after the watch is gone:
  // it must hold what it needs (a weak_ptr to its owner, not `this`).
  class Watch {
   public:
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;
    // The callback runs once when the descriptor is next readable, hung up or in error.
    void arm();

   private:
    friend class IoPool;
    Watch(std::shared_ptr<State> pool, int fd, uint64_t id);
    std::shared_ptr<State> pool_;
    int fd_;
    uint64_t id_;
  };

  static Result<std::unique_ptr<IoPool>> create(Options options);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  void post(std::function<void()> task);

  // Watches `fd`, armed at once.
  Result<std::unique_ptr<Watch>> watch(int fd, std::function<void()> on_ready);

  // `tick` runs on a worker at each time it asks for (its return value; time_point::max():
  // none until wake_timer_by). Null: no timer.
  void set_timer(std::function<Clock::time_point()> tick);
  // Runs the tick by `when` at the latest (never later than already asked for).
  void wake_timer_by(Clock::time_point when);

  int threads() const;

 private:
  explicit IoPool(std::shared_ptr<State> state) : s_(std::move(state)) {}
  std::shared_ptr<State> s_;
};

}  // namespace kvferry
