#include "transport/cuda_memory_api.h"

namespace kvferry {

std::string_view pointer_kind_name(PointerKind kind) {
  switch (kind) {
    case PointerKind::kUnregistered: return "pageable host memory (not known to CUDA)";
    case PointerKind::kPinnedHost: return "pinned host memory";
    case PointerKind::kDevice: return "device memory";
    case PointerKind::kManaged: return "managed memory";
  }
  return "unknown memory";
}

}  // namespace kvferry
