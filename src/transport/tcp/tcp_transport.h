// The tcp transport: host memory to a peer on any host over persistent TCP connections
// (TcpLink on the initiating side, TcpServer receiving; wire format in docs/PROTOCOL.md).
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kvferry {

// Starts the receiver (its listener and I/O threads). InvalidArgument for a malformed
// listen address or lane count.
Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportEnv& env);

}  // namespace kvferry
