#include "core/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>

#include "core/net.h"

extern char** environ;

namespace kvferry {

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv) {
  if (argv.empty()) return InvalidArgument("spawn: empty argv");
  int in_pipe[2];
  int out_pipe[2];
  if (::pipe2(in_pipe, O_CLOEXEC) != 0) return ErrnoStatus(StatusCode::kInternal, "pipe", errno);
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    ::close(in_pipe[0]);
    ::close(in_pipe[1]);
    return ErrnoStatus(StatusCode::kInternal, "pipe", errno);
  }
  Fd child_in(in_pipe[0]), parent_out(in_pipe[1]), parent_in(out_pipe[0]), child_out(out_pipe[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, child_in.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, child_out.get(), STDOUT_FILENO);
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ChildProcess child;
  int rc = ::posix_spawn(&child.pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return ErrnoStatus(StatusCode::kInternal, "spawn " + argv[0], rc);
  child.to_child_ = std::move(parent_out);
  child.from_child_ = std::move(parent_in);
  return child;
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  finish(std::chrono::milliseconds(1000)).status().ignore();
}

Status ChildProcess::send_line(const std::string& line) {
  std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(to_child_.get(), data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ErrnoStatus(StatusCode::kPeerDisconnected, "write to child", errno);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  for (;;) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return Timeout("no line from child " + std::to_string(pid_));
    pollfd p{from_child_.get(), POLLIN, 0};
    int rc = ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    char buf[4096];
    ssize_t n = ::read(from_child_.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return PeerDisconnected("child " + std::to_string(pid_) + " closed its output");
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

Result<std::vector<std::string>> ChildProcess::read_to_end(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> lines;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto line = read_line(std::max(left, std::chrono::milliseconds(0)));
    if (line.ok()) {
      lines.push_back(std::move(*line));
      continue;
    }
    if (line.status().code() != StatusCode::kPeerDisconnected) return line.status();
    if (!buffered_.empty()) lines.push_back(std::exchange(buffered_, {}));
    return lines;
  }
}

Result<std::string> ChildProcess::ask(const std::string& line, std::chrono::milliseconds timeout) {
  KVF_RETURN_IF_ERROR(send_line(line));
  return read_line(timeout);
}

void ChildProcess::kill_now() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

Result<int> ChildProcess::finish(std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return FailedPrecondition("child already reaped");
  to_child_.reset();
  auto deadline = Clock::now() + timeout;
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) break;
    if (Clock::now() >= deadline) {
      kill_now();
      return Timeout("child did not exit in time; killed");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

}  // namespace kvferry
