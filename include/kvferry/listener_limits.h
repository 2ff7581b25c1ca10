// ListenerLimits: what the clients of one kvferry listener (the p2p handshake, the tcp data
// receiver, the PD control listener, the bootstrap HTTP server) may hold at once, and how
// long they may take, so that a hostile or careless client can neither exhaust the process
// (descriptors, threads, memory) nor stall the clients that behave. docs/PROTOCOL.md,
// "Listener limits", lists the defaults per listener.
//
// Thread-safety: a value type.
#pragma once

#include <chrono>
#include <cstdint>

#include "kvferry/defaults.h"

namespace kvferry {

struct ListenerLimits {
  // Connections open at once on the listener; the next one is closed as soon as it is
  // accepted (logged at most once per interval), except on the handshake and bootstrap HTTP
  // listeners, which close the oldest connection that has not sent its whole request, from
  // the source holding the most, to admit it (core/acceptor.h). 0 = no limit.
  uint32_t max_connections = 512;
  // Connections open at once from one source address (IP); 0 = no limit.
  uint32_t max_connections_per_source = 64;
  // Time a new connection has to finish its opening exchange: the whole request and its
  // reply on the handshake and HTTP listeners, the hello (and authentication) on tcp data,
  // the RegisterLayout on PD control. A connection that has not is closed.
  std::chrono::milliseconds hello_timeout = kDefaultHandshakeTimeout;
  // An established connection on which nothing arrives for this long is closed (tcp data
  // lanes are reopened by their initiator on next use). 0 = never.
  std::chrono::milliseconds idle_timeout{0};
};

}  // namespace kvferry
