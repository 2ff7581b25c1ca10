// A pool of up to N worker threads running queued tasks in FIFO order. Started now, all N
// threads start with the pool (the engine's copy workers, which batches are split across);
// started on demand, a thread starts when a task is posted and none is waiting, up to N, and
// an idle pool holds none (a server whose requests are rare: an engine's shm descriptor
// server runs no thread until a peer asks). Started threads stay until the pool goes.
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

namespace kvferry {

class ThreadPool {
 public:
  enum class Start : uint8_t { kNow, kOnDemand };
  // Worker i is named `name`-i (core/named_thread.h).
  explicit ThreadPool(int threads, const std::string& name = "kvf-pool", Start start = Start::kNow);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void post(std::function<void()> task);
  // The most threads it runs (started or not).
  int size() const { return max_threads_; }

 private:
  void start_worker_locked();
  void run();

  const int max_threads_;
  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  int waiting_ = 0;                   // workers waiting for a task; guarded by mu_
  std::vector<std::thread> workers_;  // guarded by mu_
};

// The CPUs this process may run on (its affinity mask; at least 1), read once.
int usable_cpu_count();

}  // namespace kvferry
