#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

#include "core/named_thread.h"

namespace kvferry {

int usable_cpu_count() {
  static const int count = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return count;
}

ThreadPool::ThreadPool(int threads, const std::string& name, Start start)
    : max_threads_(std::max(threads, 0)), name_(name) {
  std::lock_guard lock(mu_);
  workers_.reserve(static_cast<size_t>(max_threads_));
  if (start == Start::kNow) {
    for (int i = 0; i < max_threads_; ++i) {
      std::thread t = named_thread(name_ + "-" + std::to_string(i), [this] { run(); });
      workers_.push_back(std::move(t));
    }
  }
}

ThreadPool::~ThreadPool() {
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    workers.swap(workers_);
  }
  cv_.notify_all();
  for (auto& w : workers) w.join();
}

Status ThreadPool::start_worker_locked() {
  KVF_ASSIGN_OR_RETURN(
      std::thread t,
      start_named_thread(name_ + "-" + std::to_string(workers_.size()), [this] { run(); }));
  workers_.push_back(std::move(t));
  return Status::Ok();
}

Status ThreadPool::post(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    // Every waiting worker has a task already: one more starts, if the pool may grow.
    if (!stopping_ && waiting_ <= static_cast<int>(queue_.size()) &&
        static_cast<int>(workers_.size()) < max_threads_) {
      if (Status started = start_worker_locked(); !started.ok()) {
        if (workers_.empty()) return started;
        start_failures_.warn("{}; the pool's {} thread(s) take its tasks in turn",
                             started.message(), workers_.size());
      }
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return Status::Ok();
}

void ThreadPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      ++waiting_;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --waiting_;
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace kvferry
