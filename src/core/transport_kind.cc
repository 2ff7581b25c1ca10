#include "kvferry/transport_kind.h"

#include <string>

namespace kvferry {

std::string_view transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kLocal: return "local";
    case TransportKind::kShm: return "shm";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kCudaIpc: return "cuda_ipc";
    case TransportKind::kRdma: return "rdma";
  }
  return "unknown";
}

Result<TransportKind> parse_transport_kind(std::string_view name) {
  std::string valid;
  for (TransportKind kind : kAllTransportKinds) {
    if (transport_kind_name(kind) == name) return kind;
    if (!valid.empty()) valid += ", ";
    valid += transport_kind_name(kind);
  }
  return InvalidArgument("unknown transport '" + std::string(name) + "' (valid: " + valid + ")");
}

}  // namespace kvferry
