// CudaMemoryApi: the few CUDA runtime calls that registration and IPC handle caching make,
// behind an interface free of CUDA headers. The real one (cuda_runtime_memory_api.cc)
// calls libcudart; tests substitute a fake, so the validation and caching logic runs on
// machines without a GPU.
//
// Thread-safety: implementations must allow concurrent calls.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include "kvferry/status.h"
#include "metadata/segment_descriptor.h"

namespace kvferry::cuda_ipc {

using IpcHandle = std::array<uint8_t, kCudaIpcHandleBytes>;

// What cudaPointerGetAttributes says a pointer is.
enum class PointerKind : uint8_t { kUnregistered = 0, kPinnedHost, kDevice, kManaged };
std::string_view pointer_kind_name(PointerKind kind);

struct PointerInfo {
  PointerKind kind = PointerKind::kUnregistered;
  int device = -1;  // for kDevice (and pinned/managed memory, the device it is tied to)
};

// The allocation (one cudaMalloc, or one block of a caching allocator) containing a pointer.
struct AllocationRange {
  uint64_t base = 0;
  uint64_t bytes = 0;
};

class CudaMemoryApi {
 public:
  virtual ~CudaMemoryApi() = default;
  virtual Result<PointerInfo> pointer_info(const void* ptr) = 0;
  // cuMemGetAddressRange (reached through the runtime, never by linking libcuda).
  virtual Result<AllocationRange> allocation_range(const void* ptr) = 0;
  // cudaIpcGetMemHandle of the allocation starting at `base`, on `device`.
  virtual Result<IpcHandle> export_handle(void* base, int device) = 0;
  // cudaIpcOpenMemHandle in the context of `device` (peer access enabled lazily); returns
  // this process's pointer to the allocation's first byte.
  virtual Result<void*> open_handle(const IpcHandle& handle, int device) = 0;
  // cudaIpcCloseMemHandle of a pointer open_handle returned.
  virtual void close_handle(void* base) = 0;
};

// The real API over libcudart. NotSupported "no CUDA device: <runtime error>" when the
// runtime finds no usable device (no driver, no GPU).
Result<std::unique_ptr<CudaMemoryApi>> open_cuda_runtime_memory_api();

}  // namespace kvferry::cuda_ipc
