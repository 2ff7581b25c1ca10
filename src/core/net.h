// Small TCP helpers over raw sockets: endpoint parsing, listening, and blocking I/O with
// a deadline (poll-based), used by the handshake and, later, the tcp transport.
//
// Thread-safety: free functions with no shared state.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

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

// Binds and listens (SO_REUSEADDR); the returned endpoint has the real port.
Result<Fd> listen_tcp(const Endpoint& endpoint, Endpoint* bound);

// Connects before `deadline`. PeerUnreachable on refusal or timeout, naming the endpoint.
Result<Fd> connect_tcp(const Endpoint& endpoint, Clock::time_point deadline);

// Sends or receives exactly the buffer before `deadline`. Timeout, PeerDisconnected
// (orderly close or reset) or Internal.
Status send_all(int fd, std::span<const std::byte> data, Clock::time_point deadline);
Status recv_all(int fd, std::span<std::byte> data, Clock::time_point deadline);

// Over a Unix socket: sends `bytes` with `fd` attached (SCM_RIGHTS), and receives exactly
// `out`, keeping a descriptor that came attached to any of it in `received`. Timeout,
// PeerDisconnected or an errno status.
Status send_with_fd(int socket, std::span<const std::byte> bytes, int fd,
                    Clock::time_point deadline);
Status recv_with_fd(int socket, std::span<std::byte> out, Fd& received, Clock::time_point deadline);

}  // namespace kvferry
