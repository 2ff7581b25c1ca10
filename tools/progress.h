// Progress: "label: 3/12 cells, 40 s left" on stderr for long-running tools, rewritten in
// place, only when stderr is a terminal (nothing in logs, pipes or CI output). The estimate
// is the mean time per finished step times the steps left.
//
// Thread-safety: one thread at a time.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace kvferry::cli {

class Progress {
 public:
  Progress(std::string label, size_t total)
      : label_(std::move(label)), total_(total), on_(::isatty(STDERR_FILENO) == 1) {}
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void step() {
    ++done_;
    if (!on_) return;
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - start_).count();
    const double left_s = done_ == 0 ? 0 : elapsed_s / done_ * (total_ - done_);
    std::fputs(fmt::format("\r\033[K{}: {}/{} cells, {:.0f} s left", label_, done_, total_, left_s)
                   .c_str(),
               stderr);
    std::fflush(stderr);
  }
  // A cell in a loop body: steps when it goes out of scope (also on `continue`).
  class Cell {
   public:
    explicit Cell(Progress& p) : p_(p) {}
    ~Cell() { p_.step(); }
    Cell(const Cell&) = delete;
    Cell& operator=(const Cell&) = delete;

   private:
    Progress& p_;
  };
  Cell cell() { return Cell(*this); }

  // Clears the line (once).
  void finish() {
    if (on_ && done_ > 0) std::fputs("\r\033[K", stderr);
    on_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::string label_;
  size_t total_;
  size_t done_ = 0;
  bool on_;
  Clock::time_point start_ = Clock::now();
};

}  // namespace kvferry::cli
