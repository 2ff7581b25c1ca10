// Small TCP helpers over raw sockets: endpoint parsing, listening, and blocking I/O with
// a deadline (poll-based), used by the handshake and, later, the tcp transport.
//
// Thread-safety: free functions with no shared state.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/fd.h"
#include "kvferry/status.h"

namespace kvferry {

using Clock = std::chrono::steady_clock;

struct Endpoint {
  std::string host;  // IPv4 literal or a name resolvable by getaddrinfo
  uint16_t port = 0;
  std::string to_string() const { return host + ":" + std::to_string(port); }
};

// "host:port" with a non-empty host and a port in 1..65535 (0 too when allow_port_zero).
// The error names the bad input.
Result<Endpoint> parse_endpoint(std::string_view text, bool allow_port_zero = false);

// "0.0.0.0": a listener on every interface. A peer cannot dial it; it dials one of
// interface_addresses(), or the host it reached the listener's owner on (reachable_via).
bool is_any_address(std::string_view host);
// 127.0.0.0/8 or "localhost".
bool is_loopback_host(std::string_view host);
// This host's IPv4 addresses that a peer on another host may dial: interfaces up, not
// loopback, in the kernel's order. Empty when there is none (a namespace with only lo).
std::vector<std::string> interface_addresses();
// `advertised` as dialled by a peer that reached its owner at `reached_host`: an
// is_any_address host becomes `reached_host`; any other comes back as it is.
std::string reachable_via(std::string_view advertised, std::string_view reached_host);

// Binds and listens (SO_REUSEADDR); the returned endpoint has the real port.
Result<Fd> listen_tcp(const Endpoint& endpoint, Endpoint* bound);

// Connects before `deadline`. PeerUnreachable on refusal or timeout, naming the endpoint.
Result<Fd> connect_tcp(const Endpoint& endpoint, Clock::time_point deadline);

// Sends or receives exactly the buffer before `deadline`. Timeout, PeerDisconnected
// (orderly close or reset) or Internal.
Status send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline);
Status recv_all(int fd, std::span<std::byte> data, Clock::time_point deadline);
// Receives what has arrived, up to the buffer, without waiting: the byte count (0 when
// nothing has arrived yet), or recv_all's errors (PeerDisconnected on an orderly close).
Result<size_t> recv_ready(int fd, std::span<std::byte> data);

// One sendmsg/recvmsg message over `data` with room for one attached descriptor
// (SCM_RIGHTS). Only system-call structures on the stack: usable in a child after fork.
struct FdMessage {
  FdMessage(void* data, size_t size) : iov{data, size} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
  // Attaches `fd` (sending side).
  void attach(int fd) {
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  // The descriptor that came attached, or -1 (receiving side).
  int attached() {
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
          c->cmsg_len >= CMSG_LEN(sizeof(int))) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
        return fd;
      }
    }
    return -1;
  }

  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
};

// Abstract Unix sockets (a name in the network namespace, no file): a listener bound to
// "\0<name>" (non-blocking, close-on-exec), and a blocking connection to one. `what` names
// the socket in errors. connect_abstract: PeerUnreachable when nothing listens there
// (another network namespace, or the owner is gone).
Result<Fd> listen_abstract(const std::string& name, int backlog);
Result<Fd> connect_abstract(const std::string& name, std::string_view what);

// Over a Unix socket: sends `bytes` with `fd` attached (SCM_RIGHTS), and receives exactly
// `out`, keeping a descriptor that came attached to any of it in `received`. Timeout,
// PeerDisconnected or an errno status.
Status send_with_fd(int socket, std::span<const std::byte> bytes, int fd,
                    Clock::time_point deadline);
Status recv_with_fd(int socket, std::span<std::byte> out, Fd& received, Clock::time_point deadline);

}  // namespace kvferry
