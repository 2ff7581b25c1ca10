// Hostile clients for the listener-limit tests: connections from chosen loopback source
// addresses (127.0.0.N, so a flood from "other hosts" does not use up the legitimate
// client's per-source share), and what this process holds (descriptors, resident memory,
// threads), read from /proc/self.
//
// Thread-safety: free functions; a HostileCrowd belongs to one thread.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/net.h"
#include "test_support.h"

namespace kvferry::testing {

// Descriptors open in this process now.
inline size_t open_fd_count() {
  size_t n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir) != nullptr) ++n;
    ::closedir(dir);
  }
  return n > 2 ? n - 3 : 0;  // ".", ".." and the directory's own descriptor
}

// A "Key:   N kB"-style field of /proc/self/status.
inline uint64_t proc_status_field(const std::string& key) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key + ":", 0) == 0) return std::stoull(line.substr(key.size() + 1));
  }
  return 0;
}
inline uint64_t resident_bytes() { return proc_status_field("VmRSS") * 1024; }
inline uint64_t thread_count() { return proc_status_field("Threads"); }

// A blocking TCP connection to `to` (an IPv4 literal endpoint) from `source`; invalid if
// the connect failed.
inline Fd connect_from(const std::string& source, const Endpoint& to) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(to.port);
  ::inet_pton(AF_INET, to.host.c_str(), &remote.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      ::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) != 0) {
    return Fd();
  }
  return fd;
}

// Whether the other side has closed or reset the connection, whatever is still unread.
inline bool closed_by_other_side(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return true;
  return info.tcpi_state != TCP_ESTABLISHED;
}

// Sends what the socket takes now, without waiting; the bytes it took.
inline size_t send_now(int fd, std::span<const std::byte> bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  return sent;
}

// Many connections from sources 127.0.0.2 .. 127.0.0.(1 + sources), each sent `opening`
// (perhaps nothing, perhaps the start of a request that never ends), then left alone.
class HostileCrowd {
 public:
  HostileCrowd(const Endpoint& to, size_t connections, size_t sources,
               std::span<const std::byte> opening = {}) {
    for (size_t i = 0; i < connections; ++i) {
      Fd fd = connect_from("127.0.0." + std::to_string(2 + i % sources), to);
      if (!fd.valid()) continue;
      send_now(fd.get(), opening);
      fds_.push_back(std::move(fd));
    }
  }
  size_t connected() const { return fds_.size(); }
  // How many of them the server has closed (end of stream or reset on a read now).
  size_t closed_by_server() const {
    size_t closed = 0;
    for (const Fd& fd : fds_) {
      std::byte probe[256];
      ssize_t n = ::recv(fd.get(), probe, sizeof(probe), MSG_DONTWAIT);
      while (n > 0) n = ::recv(fd.get(), probe, sizeof(probe), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ++closed;
    }
    return closed;
  }
  void disperse() { fds_.clear(); }

 private:
  std::vector<Fd> fds_;
};

}  // namespace kvferry::testing
