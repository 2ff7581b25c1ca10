#include "core/net.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace kvferry {
namespace {

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
}

// Waits for `events` on fd; Timeout when the deadline passes first.
Status wait_for(int fd, short events, Clock::time_point deadline, std::string_view what) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return Status::Ok();
    if (rc == 0) return Timeout(std::string(what) + " timed out");
    if (errno != EINTR) return ErrnoStatus(StatusCode::kInternal, "poll", errno);
  }
}

// sun_path[0] = '\0' marks the abstract namespace; the name follows, unterminated.
Result<sockaddr_un> abstract_address(const std::string& name, socklen_t& length) {
  sockaddr_un address{};
  if (name.empty() || name.size() > sizeof(address.sun_path) - 1) {
    return InvalidArgument("abstract socket name of " + std::to_string(name.size()) +
                           " bytes is empty or longer than " +
                           std::to_string(sizeof(address.sun_path) - 1));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return address;
}

Result<sockaddr_in> resolve(const Endpoint& endpoint) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(endpoint.port);
  if (inet_pton(AF_INET, endpoint.host.c_str(), &addr.sin_addr) == 1) return addr;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = getaddrinfo(endpoint.host.c_str(), nullptr, &hints, &found);
  if (rc != 0 || found == nullptr) {
    return PeerUnreachable("cannot resolve host '" + endpoint.host + "': " + gai_strerror(rc));
  }
  addr.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
  freeaddrinfo(found);
  return addr;
}

}  // namespace

Result<Endpoint> parse_endpoint(std::string_view text, bool allow_port_zero) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument("malformed endpoint '" + std::string(text) + "': " + std::string(why) +
                           " (expected host:port)");
  };
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("no ':'");
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.empty()) return bad("empty host");
  for (char c : host) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '_';
    if (!ok) return bad("invalid character in host");
  }
  unsigned port = 0;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port_text.empty()) {
    return bad("port is not a number");
  }
  if (port > 65535 || (port == 0 && !allow_port_zero)) return bad("port out of range");
  return Endpoint{std::string(host), static_cast<uint16_t>(port)};
}

bool is_any_address(std::string_view host) { return host == "0.0.0.0"; }

bool is_loopback_host(std::string_view host) {
  return host == "localhost" || host.substr(0, 4) == "127.";
}

std::vector<std::string> interface_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    if (std::find(out.begin(), out.end(), text) == out.end()) out.emplace_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

std::string reachable_via(std::string_view advertised, std::string_view reached_host) {
  const size_t colon = advertised.rfind(':');
  if (colon == std::string_view::npos || !is_any_address(advertised.substr(0, colon))) {
    return std::string(advertised);
  }
  return std::string(reached_host) + std::string(advertised.substr(colon));
}

Result<Fd> listen_tcp(const Endpoint& endpoint, Endpoint* bound) {
  KVF_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(endpoint));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "socket", errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "bind " + endpoint.to_string(), errno);
  }
  if (::listen(fd.get(), 512) != 0) return ErrnoStatus(StatusCode::kInternal, "listen", errno);
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  if (bound != nullptr) *bound = Endpoint{endpoint.host, ntohs(addr.sin_port)};
  return fd;
}

Result<Fd> connect_tcp(const Endpoint& endpoint, Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(sockaddr_in addr, resolve(endpoint));
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return ErrnoStatus(StatusCode::kInternal, "socket", errno);
  int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  if (rc != 0 && errno != EINPROGRESS) {
    return ErrnoStatus(StatusCode::kPeerUnreachable, "connect to " + endpoint.to_string(), errno);
  }
  if (rc != 0) {
    Status waited = wait_for(fd.get(), POLLOUT, deadline, "connect to " + endpoint.to_string());
    if (!waited.ok()) return PeerUnreachable(waited.message());
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      return ErrnoStatus(StatusCode::kPeerUnreachable, "connect to " + endpoint.to_string(), err);
    }
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

Status send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KVF_RETURN_IF_ERROR(wait_for(fd, POLLOUT, deadline, "send"));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return ErrnoStatus(StatusCode::kPeerDisconnected, "send", errno);
    }
    return ErrnoStatus(StatusCode::kInternal, "send", errno);
  }
  return Status::Ok();
}

Result<size_t> recv_ready(int fd, std::span<std::byte> data) {
  for (;;) {
    const ssize_t n = ::recv(fd, data.data(), data.size(), MSG_DONTWAIT);
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) return PeerDisconnected("connection closed by peer");
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    if (errno == EINTR) continue;
    if (errno == ECONNRESET) return ErrnoStatus(StatusCode::kPeerDisconnected, "recv", errno);
    return ErrnoStatus(StatusCode::kInternal, "recv", errno);
  }
}

Status recv_all(int fd, std::span<std::byte> data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    KVF_ASSIGN_OR_RETURN(const size_t n, recv_ready(fd, data.subspan(done)));
    if (n == 0) KVF_RETURN_IF_ERROR(wait_for(fd, POLLIN, deadline, "receive"));
    done += n;
  }
  return Status::Ok();
}

Status send_with_fd(int socket, std::span<const std::byte> bytes, int fd,
                    Clock::time_point deadline) {
  pollfd p{socket, POLLOUT, 0};
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) != 1) {
    return Timeout("the peer does not read what is sent to it");
  }
  FdMessage m(const_cast<std::byte*>(bytes.data()), bytes.size());
  m.attach(fd);
  ssize_t n = ::sendmsg(socket, &m.msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0) return ErrnoStatus(StatusCode::kPeerDisconnected, "sendmsg with a descriptor", errno);
  // The fd went with the first byte; the rest (if the buffer took only part) follows plainly.
  if (static_cast<size_t>(n) < bytes.size()) return send_all(socket, bytes.subspan(n), deadline);
  return Status::Ok();
}

Status recv_with_fd(int socket, std::span<std::byte> out, Fd& received,
                    Clock::time_point deadline) {
  size_t done = 0;
  while (done < out.size()) {
    pollfd p{socket, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) {
      return Timeout("no reply before the deadline");
    }
    FdMessage m(out.data() + done, out.size() - done);
    ssize_t n = ::recvmsg(socket, &m.msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    if (n < 0) return ErrnoStatus(StatusCode::kPeerDisconnected, "recvmsg", errno);
    if (n == 0) return PeerDisconnected("the peer closed the connection");
    if (int fd = m.attached(); fd >= 0) received = Fd(fd);
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

Result<Fd> listen_abstract(const std::string& name, int backlog) {
  socklen_t length = 0;
  KVF_ASSIGN_OR_RETURN(sockaddr_un address, abstract_address(name, length));
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!listener.valid()) return ErrnoStatus(StatusCode::kInternal, "socket(AF_UNIX)", errno);
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listener.get(), backlog) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "listen on @" + name, errno);
  }
  return listener;
}

Result<Fd> connect_abstract(const std::string& name, std::string_view what) {
  socklen_t length = 0;
  Result<sockaddr_un> address = abstract_address(name, length);
  if (!address.ok()) return ProtocolError(std::string(what) + ": " + address.status().message());
  Fd conn(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!conn.valid()) return ErrnoStatus(StatusCode::kInternal, "socket(AF_UNIX)", errno);
  // A local connect either succeeds or fails at once (a full backlog blocks: not here).
  if (::connect(conn.get(), reinterpret_cast<sockaddr*>(&*address), length) != 0) {
    return PeerUnreachable(std::string("cannot reach ") + std::string(what) + " @" + name + ": " +
                           std::strerror(errno) +
                           " (another network namespace, or the peer is gone)");
  }
  return conn;
}

}  // namespace kvferry
