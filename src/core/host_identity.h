// Identity of "this host" as far as same-host transports are concerned: the kernel boot id
// plus the pid namespace (cma addresses the peer by pid, and peer death is watched through a
// pidfd of the peer's pid, so both processes must see the same pids). Two engines with equal
// host ids may try shm, which also needs the peer's abstract Unix socket (the memfd comes
// over it, transport/shm_fd_server.h), hence the same network namespace: a peer in another
// one fails that fetch and takes the next route.
#pragma once

#include <string>

namespace kvferry {

// Computed once; thread-safe.
const std::string& host_identity();

}  // namespace kvferry
