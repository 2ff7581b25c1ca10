// A fixed-size pool of worker threads running queued tasks in FIFO order.
//
// Thread-safety: post() may be called from any thread, including a worker. The
// destructor drains nothing: it runs the tasks already queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvferry {

class ThreadPool {
 public:
  // Worker i is named `name`-i (core/named_thread.h).
  explicit ThreadPool(int threads, const std::string& name = "kvf-pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void post(std::function<void()> task);
  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

// The CPUs this process may run on (its affinity mask; at least 1), read once.
int usable_cpu_count();

}  // namespace kvferry
