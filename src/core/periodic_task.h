// PeriodicTask: runs a callback on its own thread every `period` until destroyed.
// Thread-safety: construction and destruction from one thread; the callback runs on the
// task's thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/named_thread.h"

namespace kvferry {

class PeriodicTask {
 public:
  // A task whose thread runs; Internal when the thread cannot start (core/named_thread.h).
  static Result<std::unique_ptr<PeriodicTask>> start(std::chrono::milliseconds period,
                                                     std::function<void()> callback,
                                                     std::string name = "kvf-periodic") {
    std::unique_ptr<PeriodicTask> task(new PeriodicTask(period, std::move(callback)));
    PeriodicTask* t = task.get();
    KVF_ASSIGN_OR_RETURN(task->thread_, start_named_thread(std::move(name), [t] { t->run(); }));
    return task;
  }
  ~PeriodicTask() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  PeriodicTask(std::chrono::milliseconds period, std::function<void()> callback)
      : period_(period), callback_(std::move(callback)) {}
  void run() {
    std::unique_lock lock(mu_);
    while (!cv_.wait_for(lock, period_, [this] { return stopping_; })) {
      lock.unlock();
      callback_();
      lock.lock();
    }
  }

  std::chrono::milliseconds period_;
  std::function<void()> callback_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvferry
