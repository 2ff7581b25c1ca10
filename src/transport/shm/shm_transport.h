// The shm transport: ops to a same-host peer's memory that it allocated with
// allocate_shared (a memfd this process maps), copied with memcpy. The mapping itself is
// the engine's view of the peer (transport/shm_mapping.h, capability
// maps_remote_host_memory); this transport only copies through it.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kvferry {

Result<std::unique_ptr<Transport>> make_shm_transport(const TransportEnv& env);

}  // namespace kvferry
