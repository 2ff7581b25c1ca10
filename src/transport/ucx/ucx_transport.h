// The ucx transport: host memory to a peer on any host through UCX. With RDMA hardware on
// both sides (InfiniBand, RoCE: UCX's rc, dc, ud transports) it posts put/get on registered
// memory and the NIC checks every access against the rkey; elsewhere (tcp, shared memory)
// it moves bytes as kvferry's own active messages, which the target range-checks and
// deadline-checks itself (ucx_am_wire.h). Such emulated paths authenticate nothing at UCX's
// level, and UCX's lower layers still carry unchecked writes, so the transport uses them
// only when allowed (EngineOptions::ucx_allow_emulated or KVFERRY_UCX_ALLOW_EMULATED=1).
// See docs/TRANSPORTS.md, "ucx".
//
// Pieces: UcxWorker (context, worker, progress thread, active-message handlers),
// UcxChannel (one per peer: endpoint, rkeys, jobs), ucx_am_wire (the active messages and
// the data-path choice), ucx_resources (what UCX offers here). Every region is mapped with
// ucp_mem_map and its packed rkey published in the descriptor with the worker address.
//
// Route preference: ucx wins a route from tcp only when UCX reports hardware RMA on both
// sides; forced, it carries any host route it can connect.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kvferry {

// Starts UCX (context, worker, progress thread) when it is usable here: a hardware RMA
// transport, or emulation allowed. Otherwise the transport is inert and says why in every
// route it refuses. Never fails the engine for want of UCX resources.
Result<std::unique_ptr<Transport>> make_ucx_transport(const TransportEnv& env);

}  // namespace kvferry
