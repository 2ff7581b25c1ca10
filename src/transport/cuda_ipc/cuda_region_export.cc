#include "transport/cuda_ipc/cuda_region_export.h"

#include <fmt/format.h>

namespace kvferry::cuda_ipc {

Result<CudaIpcBacking> export_cuda_region(CudaMemoryApi& api, void* addr, uint64_t length,
                                          MemoryLocation location) {
  const auto start = reinterpret_cast<uint64_t>(addr);
  if (location.kind != MemoryLocation::Kind::kCuda || location.device < 0) {
    return InvalidArgument(fmt::format("region [{:#x}, +{}): not a cuda:N location (device {})",
                                       start, length, location.device));
  }
  KVF_ASSIGN_OR_RETURN(PointerInfo info, api.pointer_info(addr));
  if (info.kind != PointerKind::kDevice) {
    std::string hint = info.kind == PointerKind::kPinnedHost
                           ? "; register pinned host memory with location host"
                           : "";
    return InvalidArgument(fmt::format("region [{:#x}, +{}) registered as cuda:{} is {}{}", start,
                                       length, location.device, pointer_kind_name(info.kind),
                                       hint));
  }
  if (info.device != location.device) {
    return InvalidArgument(
        fmt::format("region [{:#x}, +{}) registered as cuda:{} is memory of cuda:{}", start, length,
                    location.device, info.device));
  }
  KVF_ASSIGN_OR_RETURN(AllocationRange range, api.allocation_range(addr));
  if (start < range.base || start - range.base > range.bytes ||
      length > range.bytes - (start - range.base)) {
    return InvalidArgument(
        fmt::format("region [{:#x}, +{}) runs past its CUDA allocation [{:#x}, +{}): a region "
                    "must lie inside one allocation",
                    start, length, range.base, range.bytes));
  }
  CudaIpcBacking backing;
  KVF_ASSIGN_OR_RETURN(backing.handle,
                       api.export_handle(reinterpret_cast<void*>(range.base), location.device));
  backing.allocation_offset = start - range.base;
  backing.allocation_bytes = range.bytes;
  return backing;
}

}  // namespace kvferry::cuda_ipc
