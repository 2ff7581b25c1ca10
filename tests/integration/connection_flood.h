// A connection flood from a child process: sockets from chosen loopback source addresses
// (127.0.0.N standing in for other hosts) that connect, send nothing, and reconnect as soon
// as the server closes them, so the flood competes for the listener like a real attacker on
// another host would, with its own CPU time and descriptors. A counter in memory shared
// with the child says how many connections it has opened so far.
//
// Thread-safety: a ConnectionFlood belongs to one thread.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "core/net.h"

namespace kvferry::testing {

struct FloodOptions {
  size_t sockets = 1200;      // connections the attacker keeps trying to hold
  uint32_t first_source = 2;  // sources 127.0.0.first_source ...
  uint32_t sources = 20;      // ... 127.0.0.(first_source + sources - 1)
  // The child ends by itself this long after it started, should the test never stop it.
  std::chrono::seconds give_up_after{120};
};

class ConnectionFlood {
 public:
  ConnectionFlood(const Endpoint& target, const FloodOptions& options) {
    void* shared = ::mmap(nullptr, sizeof(std::atomic<uint64_t>), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return;
    opened_ = new (shared) std::atomic<uint64_t>(0);
    // Everything the child needs is prepared here: after fork it makes system calls only.
    std::vector<sockaddr_in> sources(options.sources);
    for (uint32_t i = 0; i < options.sources; ++i) {
      sources[i].sin_family = AF_INET;
      const std::string ip = "127.0.0." + std::to_string(options.first_source + i);
      ::inet_pton(AF_INET, ip.c_str(), &sources[i].sin_addr);
    }
    sockaddr_in remote{};
    remote.sin_family = AF_INET;
    remote.sin_port = htons(target.port);
    ::inet_pton(AF_INET, target.host.c_str(), &remote.sin_addr);
    std::vector<int> fds(options.sockets, -1);
    std::vector<epoll_event> events(256);
    started_ = std::chrono::steady_clock::now();
    child_ = ::fork();
    if (child_ == 0) {
      run_child(sources, remote, fds, events, options.give_up_after);
      ::_exit(0);
    }
  }

  ~ConnectionFlood() {
    stop();
    if (opened_ != nullptr) ::munmap(opened_, sizeof(std::atomic<uint64_t>));
  }
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  bool running() const { return child_ > 0 && !stopped_; }
  // Connections the attacker has opened so far.
  uint64_t opened() const { return opened_ == nullptr ? 0 : opened_->load(); }
  // Ends the attack and reaps the child; its sockets close with it.
  void stop() {
    if (child_ <= 0 || stopped_) return;
    stopped_ = true;
    elapsed_ = std::chrono::steady_clock::now() - started_;
    ::kill(child_, SIGKILL);
    int status = 0;
    ::waitpid(child_, &status, 0);
  }
  // Connections opened per second over the attack (call after stop()).
  double connections_per_second() const {
    const double seconds = std::chrono::duration<double>(elapsed_).count();
    return seconds > 0 ? static_cast<double>(opened()) / seconds : 0;
  }

 private:
  void run_child(const std::vector<sockaddr_in>& sources, const sockaddr_in& remote,
                 std::vector<int>& fds, std::vector<epoll_event>& events,
                 std::chrono::seconds give_up_after) {
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
      files.rlim_cur = files.rlim_max;
      ::setrlimit(RLIMIT_NOFILE, &files);
    }
    ::alarm(static_cast<unsigned>(give_up_after.count()));  // SIGALRM ends the child
    const int epoll = ::epoll_create1(EPOLL_CLOEXEC);
    auto open_socket = [&](size_t i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
      const sockaddr_in& local = sources[i % sources.size()];
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0 ||
          (::connect(fd, reinterpret_cast<const sockaddr*>(&remote), sizeof(remote)) != 0 &&
           errno != EINPROGRESS)) {
        ::close(fd);
        return;
      }
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = i;
      ::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev);
      fds[i] = fd;
      opened_->fetch_add(1, std::memory_order_relaxed);
    };
    for (;;) {
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i] < 0) open_socket(i);
      }
      const int n = ::epoll_wait(epoll, events.data(), static_cast<int>(events.size()), 10);
      for (int e = 0; e < n; ++e) {
        const size_t i = events[e].data.u64;
        ::close(fds[i]);  // the server closed it (or refused it): at once a new one
        fds[i] = -1;
        open_socket(i);
      }
    }
  }

  std::atomic<uint64_t>* opened_ = nullptr;
  pid_t child_ = -1;
  bool stopped_ = false;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::duration elapsed_{};
};

// How long the flood lasts in a test: KVFERRY_FLOOD_SECONDS when set (a manual measurement
// runs 20 s), else `fallback`.
inline std::chrono::seconds flood_duration(std::chrono::seconds fallback) {
  const char* value = std::getenv("KVFERRY_FLOOD_SECONDS");
  if (value == nullptr || *value == '\0') return fallback;
  return std::chrono::seconds(std::max(1, std::atoi(value)));
}

// How many source addresses the attacker uses: KVFERRY_FLOOD_SOURCES when set, else
// `fallback`.
inline uint32_t flood_sources(uint32_t fallback) {
  const char* value = std::getenv("KVFERRY_FLOOD_SOURCES");
  if (value == nullptr || *value == '\0') return fallback;
  return static_cast<uint32_t>(std::max(1, std::atoi(value)));
}

}  // namespace kvferry::testing
