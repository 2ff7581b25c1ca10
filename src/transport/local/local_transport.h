// The local transport: ops between this engine's own regions, copied with memcpy.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kvferry {

Result<std::unique_ptr<Transport>> make_local_transport(const TransportEnv& env);

}  // namespace kvferry
