// ChildProcess: a program started with pipes on its stdin and stdout, spoken to one line
// at a time. Tests, benchmarks and the demo use it to run peers in real processes.
//
// Thread-safety: one thread at a time per object. The destructor closes stdin, waits up to
// a second for the child to exit, then kills it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "core/fd.h"
#include "kvferry/status.h"

namespace kvferry {

class ChildProcess {
 public:
  static Result<ChildProcess> spawn(const std::vector<std::string>& argv);
  ChildProcess(ChildProcess&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        to_child_(std::move(o.to_child_)),
        from_child_(std::move(o.from_child_)),
        buffered_(std::move(o.buffered_)) {}
  ChildProcess& operator=(ChildProcess&&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  // Writes `line` and a newline to the child's stdin.
  Status send_line(const std::string& line);
  // Reads one line from the child's stdout (without the newline). Timeout or
  // PeerDisconnected (the child closed stdout).
  Result<std::string> read_line(std::chrono::milliseconds timeout);
  // Reads lines until the child closes its stdout (a last line without a newline included).
  // Timeout if it has not closed it within `timeout`.
  Result<std::vector<std::string>> read_to_end(std::chrono::milliseconds timeout);
  // send_line then read_line.
  Result<std::string> ask(const std::string& line, std::chrono::milliseconds timeout);
  void kill_now();  // SIGKILL and reap
  // Closes stdin and waits for exit; returns the exit code (or 128 + signal).
  Result<int> finish(std::chrono::milliseconds timeout);

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  Fd to_child_;
  Fd from_child_;
  std::string buffered_;
};

}  // namespace kvferry
