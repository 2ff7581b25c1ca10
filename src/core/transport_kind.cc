#include "kvferry/transport_kind.h"

#include <string>

#include "kvferry/transfer_types.h"

namespace kvferry {

std::string_view transport_kind_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kLocal: return "local";
    case TransportKind::kShm: return "shm";
    case TransportKind::kTcp: return "tcp";
    case TransportKind::kCudaIpc: return "cuda_ipc";
    case TransportKind::kRdma: return "rdma";
    case TransportKind::kCma: return "cma";
    case TransportKind::kUcx: return "ucx";
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

std::string_view memory_kind_name(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost: return "host";
    case MemoryKind::kSharedHost: return "shared_host";
    case MemoryKind::kDevice: return "device";
  }
  return "unknown";
}

}  // namespace kvferry
