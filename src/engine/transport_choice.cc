#include "engine/transport_choice.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvferry::detail {

bool advertises_device_memory(const SegmentDescriptor& peer) {
  return std::any_of(peer.regions.begin(), peer.regions.end(),
                     [](const RegionDescriptor& r) { return r.cuda.has_value(); });
}

Result<TransportKind> choose_transport(const SegmentDescriptor& d,
                                       const TransportChoiceInput& input) {
  std::optional<Status> device;  // asked once, on demand
  auto why_not = [&](TransportKind kind) -> std::string {
    if (!input.served.contains(kind)) return "this engine does not serve it";
    if (!d.transports.contains(kind)) return "the peer does not serve it";
    switch (kind) {
      case TransportKind::kLocal: return "local only reaches this engine itself";
      case TransportKind::kShm:
      case TransportKind::kCudaIpc:
        if (input.is_self) return "it would reach this engine itself (use local)";
        if (!input.same_host) return "the peer is on another host (host id " + d.host_id + ")";
        if (kind == TransportKind::kCudaIpc) {
          if (!device) device = input.device_usable ? input.device_usable() : Internal("unknown");
          return device->ok() ? "" : device->message();
        }
        return "";
      case TransportKind::kTcp:
        return d.tcp_endpoint.empty() ? "the peer advertises no tcp endpoint" : "";
      case TransportKind::kRdma: return "not built";
    }
    return "not built";
  };
  if (input.forced) {
    std::string reason = why_not(*input.forced);
    if (!reason.empty()) {
      return NotSupported(fmt::format("forced transport {} cannot reach peer {}: {}",
                                      transport_kind_name(*input.forced), d.endpoint, reason));
    }
    return *input.forced;
  }
  std::string cuda_reason = "the peer advertises no device memory";
  if (advertises_device_memory(d)) {
    cuda_reason = why_not(TransportKind::kCudaIpc);
    if (cuda_reason.empty()) return TransportKind::kCudaIpc;
  }
  std::string shm_reason = why_not(TransportKind::kShm);
  std::string tcp_reason = why_not(TransportKind::kTcp);
  // shm reaches only memory the peer allocated shareable; private host memory of a
  // same-host peer needs tcp (device memory needs cuda_ipc: neither helps it).
  const bool all_host_shareable =
      std::all_of(d.regions.begin(), d.regions.end(), [](const RegionDescriptor& r) {
        return r.shm.has_value() || r.location.kind == MemoryLocation::Kind::kCuda;
      });
  if (shm_reason.empty() && (all_host_shareable || !tcp_reason.empty())) {
    return TransportKind::kShm;
  }
  if (tcp_reason.empty()) return TransportKind::kTcp;
  return NotSupported(fmt::format("no transport reaches peer {}: cuda_ipc: {}; shm: {}; tcp: {}",
                                  d.endpoint, cuda_reason, shm_reason, tcp_reason));
}

}  // namespace kvferry::detail
