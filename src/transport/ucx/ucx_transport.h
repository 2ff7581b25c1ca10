// The ucx transport: host memory to a peer on any host through UCX (put/get on registered
// memory). On RDMA hardware (InfiniBand, RoCE: UCX's rc, dc, ud transports) the NIC moves
// the bytes and checks every access against the rkey; elsewhere UCX emulates put/get in the
// target's software (tcp, shared memory), which neither range-checks nor authenticates, so
// the transport uses such a path only when allowed (EngineOptions::ucx_allow_emulated or
// KVFERRY_UCX_ALLOW_EMULATED=1). See docs/TRANSPORTS.md, "ucx".
//
// Pieces: UcxWorker (context, worker, progress thread), UcxChannel (one per peer: endpoint,
// rkeys, jobs), ucx_resources (what UCX offers here). Every region is mapped with
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
