// Helpers shared by kvferry tests.
#pragma once

#include <grp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::testing {

// Unwraps a Result in a test, failing it with the status when it is an error.
template <typename T>
T must(Result<T> r) {
  if (!r.ok()) {
    ADD_FAILURE() << r.status().to_string();
    throw std::runtime_error(r.status().to_string());
  }
  return std::move(r).value();
}

inline std::unique_ptr<TransferEngine> make_engine(const std::string& name, int threads = 2,
                                                   std::optional<std::string> secret = {}) {
  EngineOptions options;
  options.name = name;
  options.worker_threads = threads;
  options.secret = std::move(secret);
  return must(TransferEngine::create(options));
}

// Threads of this process whose name starts with `prefix` (/proc/self/task).
inline size_t threads_named(const std::string& prefix) {
  size_t n = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    n += name.rfind(prefix, 0) == 0;
  }
  return n;
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

inline uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// A peer of `engine` over tcp only, at `endpoint` or at `to`'s endpoint.
inline PeerHandle open_tcp(TransferEngine& engine, const std::string& endpoint) {
  PeerOptions o;
  o.transport = TransportKind::kTcp;
  return must(engine.open_peer(endpoint, o));
}
inline PeerHandle open_tcp(TransferEngine& from, const TransferEngine& to) {
  return open_tcp(from, to.endpoint());
}

// The first `count` lines a child writes to `fd` (a pipe), waiting at most `limit` in all;
// lines that did not come are empty.
inline std::vector<std::string> read_lines(int fd, size_t count, std::chrono::milliseconds limit) {
  std::string text;
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  while (static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) < count &&
         std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1) {
    lines.push_back(text.substr(start, nl - start));
  }
  lines.resize(count);
  return lines;
}

// Writes `text` and a newline to `fd` (a forked child's report to its parent).
inline void write_line(int fd, const std::string& text) {
  std::string line = text + "\n";
  (void)!::write(fd, line.data(), line.size());
}

// In a forked child of a root test: becomes uid/gid 65534 (nobody) with no groups. False
// when the kernel refuses.
inline bool drop_to_nobody() {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(65534, 65534, 65534) == 0 &&
         ::setresuid(65534, 65534, 65534) == 0;
}

// Polls `done` every 20 ms until it holds or `limit` passed; returns its last value.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Waits until a listener on every interface (0.0.0.0) can take a port of its own: it needs a
// port no socket holds on any address (a loopback listener: on 127.0.0.1 only), and the flood
// tests that may run alongside connect from 20 loopback addresses. False after `limit`.
inline bool wait_for_any_address_port(std::chrono::milliseconds limit = std::chrono::seconds(90)) {
  return eventually(
      [] {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return false;
        const int one = 1;
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        sockaddr_in any{};
        any.sin_family = AF_INET;
        const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&any), sizeof(any)) == 0;
        ::close(fd);
        return bound;
      },
      limit);
}

// What sits in the kernel's queues of `pid`'s TCP connections (listeners left out), from
// /proc/<pid>/net/tcp and tcp6, matched to the process's own sockets by inode; only those
// bound to `local_port` unless it is 0, and with `local_ipv4` (network order; IPv4 only) to
// that address too: a client bound to another address may get the same port number.
// `unread`: received, not yet read by the process; `unsent`: written by it, not yet taken by
// the other side.
struct TcpQueues {
  uint64_t unread = 0;
  uint64_t unsent = 0;
};
inline TcpQueues tcp_queues(pid_t pid, uint16_t local_port = 0, in_addr_t local_ipv4 = INADDR_ANY) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::vector<uint64_t> inodes;
  std::error_code ec;
  for (const auto& fd : std::filesystem::directory_iterator(proc + "/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), link_ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.push_back(std::stoull(target.substr(8)));
  }
  std::sort(inodes.begin(), inodes.end());
  TcpQueues out;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the column names
    while (std::getline(in, line)) {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
      std::istringstream row(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      uint64_t inode = 0;
      row >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode;
      const size_t colon = queues.find(':');
      if (!row || state == "0A" || colon == std::string::npos ||
          !std::binary_search(inodes.begin(), inodes.end(), inode)) {
        continue;  // not this process's, or a listener (whose queue counts connections)
      }
      const size_t port_at = local.rfind(':');
      const auto port = std::stoul(local.substr(port_at + 1), nullptr, 16);
      if (local_port != 0 && port != local_port) continue;
      if (local_ipv4 != INADDR_ANY &&
          (port_at != 8 || std::stoul(local.substr(0, port_at), nullptr, 16) != local_ipv4)) {
        continue;  // another address, or an IPv6 one
      }
      out.unsent += std::stoull(queues.substr(0, colon), nullptr, 16);
      out.unread += std::stoull(queues.substr(colon + 1), nullptr, 16);
    }
  }
  return out;
}

// Waits until nothing is queued on any TCP connection of the processes `pids` (every byte
// either sent was read by the other) at two looks in a row, a poll apart: a process between
// reading one message and sending its answer shows empty queues once. False after `limit`.
inline bool tcp_settles(std::initializer_list<pid_t> pids,
                        std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  int quiet_looks = 0;
  return eventually(
      [&] {
        bool quiet = true;
        for (const pid_t pid : pids) {
          const TcpQueues q = tcp_queues(pid);
          quiet = quiet && q.unread == 0 && q.unsent == 0;
        }
        quiet_looks = quiet ? quiet_looks + 1 : 0;
        return quiet_looks >= 2;
      },
      limit);
}

// Sends SIGSTOP to `pid` and waits until every thread of it is stopped (the signal takes
// effect asynchronously: a thread may still answer a request in between). False if it did
// not stop within `limit`.
inline bool stop_process(pid_t pid, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  return eventually(
      [&] {
        std::error_code ec;
        for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
          std::ifstream stat(task.path() / "stat");
          std::string line;
          std::getline(stat, line);
          const size_t close = line.rfind(')');  // the state follows the (name)
          if (close == std::string::npos || close + 2 >= line.size()) return false;
          if (line[close + 2] != 'T' && line[close + 2] != 't') return false;
        }
        return !ec;
      },
      limit);
}

}  // namespace kvferry::testing
