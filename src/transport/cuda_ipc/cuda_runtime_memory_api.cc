// The real CudaMemoryApi over libcudart. cuMemGetAddressRange is a driver call; it is
// fetched through the runtime (cudaGetDriverEntryPoint*) so the binary never links
// libcuda and starts on machines without a driver.
#include <cudaTypedefs.h>  // PFN_cuMemGetAddressRange (types only; no libcuda link)
#include <cuda_runtime_api.h>

#include <cstring>

#include "transport/cuda_ipc/cuda_memory_api.h"
#include "transport/cuda_ipc/cuda_runtime_util.h"

namespace kvferry::cuda_ipc {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "the descriptor's IPC handle size must match the runtime's");

class RuntimeMemoryApi final : public CudaMemoryApi {
 public:
  explicit RuntimeMemoryApi(PFN_cuMemGetAddressRange_v3020 get_address_range)
      : get_address_range_(get_address_range) {}

  Result<PointerInfo> pointer_info(const void* ptr) override {
    cudaPointerAttributes attributes{};
    if (cudaError_t e = cudaPointerGetAttributes(&attributes, ptr); e != cudaSuccess) {
      return Internal(cuda_error_text("cudaPointerGetAttributes", e));
    }
    PointerInfo info;
    info.device = attributes.device;
    switch (attributes.type) {
      case cudaMemoryTypeUnregistered: info.kind = PointerKind::kUnregistered; break;
      case cudaMemoryTypeHost: info.kind = PointerKind::kPinnedHost; break;
      case cudaMemoryTypeDevice: info.kind = PointerKind::kDevice; break;
      case cudaMemoryTypeManaged: info.kind = PointerKind::kManaged; break;
    }
    return info;
  }

  Result<AllocationRange> allocation_range(const void* ptr) override {
    CUdeviceptr_v2 base = 0;
    size_t bytes = 0;
    CUresult r = get_address_range_(&base, &bytes, reinterpret_cast<CUdeviceptr_v2>(ptr));
    if (r != CUDA_SUCCESS) {
      return Internal("cuMemGetAddressRange failed with CUresult " + std::to_string(r) +
                      " (not memory from cudaMalloc or a caching allocator block?)");
    }
    return AllocationRange{static_cast<uint64_t>(base), static_cast<uint64_t>(bytes)};
  }

  Result<IpcHandle> export_handle(void* base, int device) override {
    ScopedDevice scope(device);
    if (scope.status() != cudaSuccess)
      return Internal(cuda_error_text("cudaSetDevice", scope.status()));
    cudaIpcMemHandle_t handle;
    if (cudaError_t e = cudaIpcGetMemHandle(&handle, base); e != cudaSuccess) {
      return Internal(cuda_error_text("cudaIpcGetMemHandle", e));
    }
    IpcHandle out;
    std::memcpy(out.data(), &handle, out.size());
    return out;
  }

  Result<void*> open_handle(const IpcHandle& handle, int device) override {
    // The peer's device index names a device of this process too when both see the same
    // devices (as the PD workers of one host do); otherwise the handle opens on device 0
    // and peer access is enabled lazily.
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || device < 0 || device >= devices) device = 0;
    ScopedDevice scope(device);
    if (scope.status() != cudaSuccess)
      return Internal(cuda_error_text("cudaSetDevice", scope.status()));
    cudaIpcMemHandle_t raw;
    std::memcpy(&raw, handle.data(), handle.size());
    void* ptr = nullptr;
    if (cudaError_t e = cudaIpcOpenMemHandle(&ptr, raw, cudaIpcMemLazyEnablePeerAccess);
        e != cudaSuccess) {
      return Internal(cuda_error_text("cudaIpcOpenMemHandle", e));
    }
    return ptr;
  }

  void close_handle(void* base) override {
    if (cudaError_t e = cudaIpcCloseMemHandle(base); e != cudaSuccess) {
      cuda_error_text("cudaIpcCloseMemHandle", e);  // clears it; nothing else to do
    }
  }

 private:
  PFN_cuMemGetAddressRange_v3020 get_address_range_;
};

// The driver's cuMemGetAddressRange (v2 ABI: 64-bit sizes) through the runtime.
Result<PFN_cuMemGetAddressRange_v3020> driver_address_range() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                   cudaEnableDefault, &found);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuMemGetAddressRange", &fn, cudaEnableDefault, &found);
#endif
  if (e != cudaSuccess)
    return NotSupported(cuda_error_text("cudaGetDriverEntryPoint(cuMemGetAddressRange)", e));
  if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
    return NotSupported("the CUDA driver does not provide cuMemGetAddressRange");
  }
  return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(fn);
}

}  // namespace

Result<std::unique_ptr<CudaMemoryApi>> open_cuda_runtime_memory_api() {
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess) {
    cudaGetLastError();
    return NotSupported(std::string("no CUDA device: ") + cudaGetErrorString(e));
  }
  if (devices == 0) return NotSupported("no CUDA device: cudaGetDeviceCount found none");
  KVF_ASSIGN_OR_RETURN(auto address_range, driver_address_range());
  return std::unique_ptr<CudaMemoryApi>(new RuntimeMemoryApi(address_range));
}

}  // namespace kvferry::cuda_ipc
