// WorkerOutput: one reply line at a time on stdout from any thread (the worker processes'
// protocol with the demo is line-based).
#pragma once

#include <iostream>
#include <mutex>
#include <string>

namespace kvferry::cli {

class WorkerOutput {
 public:
  void line(const std::string& text) {
    std::lock_guard lock(mu_);
    std::cout << text << std::endl;
  }

 private:
  std::mutex mu_;
};

}  // namespace kvferry::cli
