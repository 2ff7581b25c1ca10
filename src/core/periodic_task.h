// PeriodicTask: runs a callback on its own thread every `period` until destroyed.
// Thread-safety: construction and destruction from one thread; the callback runs on the
// task's thread only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/named_thread.h"

namespace kvferry {

class PeriodicTask {
 public:
  PeriodicTask(std::chrono::milliseconds period, std::function<void()> callback,
               std::string name = "kvf-periodic")
      : period_(period), callback_(std::move(callback)) {
    thread_ = named_thread(std::move(name), [this] {
      std::unique_lock lock(mu_);
      while (!cv_.wait_for(lock, period_, [this] { return stopping_; })) {
        lock.unlock();
        callback_();
        lock.lock();
      }
    });
  }
  ~PeriodicTask() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  PeriodicTask(const PeriodicTask&) = delete;
  PeriodicTask& operator=(const PeriodicTask&) = delete;

 private:
  std::chrono::milliseconds period_;
  std::function<void()> callback_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvferry
