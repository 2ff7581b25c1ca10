// choose_route: the one table that picks the transport for a route — (local memory kind,
// remote memory kind) to a peer at a place — as a pure function so tests pin it down.
//
// Transports are tried in one preference order (kRoutePreference):
//   local     this engine itself, host memory
//   cuda_ipc  same host (or self), device memory on either side
//   shm       same host, the peer's allocate_shared memory
//   cma       same host (and pid namespace), any of the peer's host memory, when the kernel
//             lets this process attach to the peer (probed once per peer in connect)
//   ucx       any host, host memory, only where UCX has hardware RMA (verbs) on both sides
//             (Transport::why_not_preferred); forced, wherever UCX connects
//   tcp       any host, host memory; in a CUDA build also device memory, staged through
//             pinned host buffers (so device routes across hosts go here)
// and the first that both engines serve and that can carry the route (Transport::why_not)
// is chosen; a better candidate passed over because its link failed (cma's probe refused)
// is named in the chosen route's reason. None: the route is refused, with why each
// candidate could not carry it; an op on it is refused before anything moves (nothing moves
// silently through a slower path). A forced transport is the only candidate.
//
// Thread-safety: pure; each candidate's why_not may initialise CUDA (cuda_ipc asks last).
#pragma once

#include <array>
#include <optional>
#include <span>

#include "kvferry/transfer_types.h"
#include "kvferry/transport_kind.h"
#include "metadata/segment_descriptor.h"
#include "transport/transport.h"

namespace kvferry::detail {

inline constexpr std::array<TransportKind, 7> kRoutePreference = {
    TransportKind::kLocal, TransportKind::kCudaIpc, TransportKind::kShm, TransportKind::kCma,
    TransportKind::kUcx,   TransportKind::kTcp,     TransportKind::kRdma};

struct RouteCandidate {
  const Transport* transport = nullptr;  // served by this engine, with a link to the peer
  std::string link_error;                // why there is no link, when transport is null
};

struct RouteChoiceInput {
  // By TransportKind: this engine's transports (null: not served here).
  std::span<const Transport* const> served;
  // By TransportKind: why the link to the peer could not be opened ("" if it was, or if the
  // transport is not served).
  std::span<const std::string> link_errors;
  PeerPlace place = PeerPlace::kOtherHost;
  std::optional<TransportKind> forced;
};

Route choose_route(RouteKey key, const SegmentDescriptor& peer, const RouteChoiceInput& input);

}  // namespace kvferry::detail
