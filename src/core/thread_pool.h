// A pool of up to N worker threads running queued tasks in FIFO order. Started now, all N
// threads start with the pool (the engine's copy workers, which batches are split across);
// started on demand, a thread starts when a task is posted and none is waiting, up to N, and
// an idle pool holds none (a server whose requests are rare: an engine's shm descriptor
// server runs no thread until a peer asks). Started threads stay until the pool goes.
//
// When the system will not start a thread (core/named_thread.h), the threads the pool has
// take its tasks in turn (a warning says so, at most once per interval); a pool with none
// refuses the task.
//
// Thread-safety: post() may be called from any thread, including a worker. The
// destructor drains nothing: it runs the tasks already queued, then joins.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/log_throttle.h"
#include "kvferry/status.h"

namespace kvferry {

class ThreadPool {
 public:
  enum class Start : uint8_t { kNow, kOnDemand };
  // Worker i is named `name`-i (core/named_thread.h).
  explicit ThreadPool(int threads, const std::string& name = "kvf-pool", Start start = Start::kNow);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Queues `task`. Internal (naming the thread, nothing queued) when the pool has no thread
  // and cannot start one.
  Status post(std::function<void()> task);
  // The most threads it runs (started or not).
  int size() const { return max_threads_; }

 private:
  Status start_worker_locked();
  void run();

  const int max_threads_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  int waiting_ = 0;                   // workers waiting for a task; guarded by mu_
  std::vector<std::thread> workers_;  // guarded by mu_
  LogThrottle start_failures_;
};

// The CPUs this process may run on (its affinity mask; at least 1), read once.
int usable_cpu_count();

}  // namespace kvferry
