// The real CudaMemoryApi over libcudart. cuMemGetAddressRange is a driver call; it is
// fetched through the runtime (cudaGetDriverEntryPoint*) so the binary never links
// libcuda and starts on machines without a driver.
#include "transport/cuda_ipc/cuda_runtime_memory_api.h"

#include <cudaTypedefs.h>  // PFN_cuMemGetAddressRange (types only; no libcuda link)
#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

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

  Result<void*> alloc_pinned(uint64_t bytes) override {
    void* p = nullptr;
    if (cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable); e != cudaSuccess) {
      return Internal(cuda_error_text("cudaHostAlloc(" + std::to_string(bytes) + " bytes)", e));
    }
    return p;
  }
  void free_pinned(void* ptr) override {
    if (cudaError_t e = cudaFreeHost(ptr); e != cudaSuccess) cuda_error_text("cudaFreeHost", e);
  }

  Result<CudaStream> create_stream(int device) override {
    ScopedDevice scope(device);
    if (scope.status() != cudaSuccess)
      return Internal(cuda_error_text("cudaSetDevice", scope.status()));
    cudaStream_t stream = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        e != cudaSuccess) {
      return Internal(cuda_error_text("cudaStreamCreateWithFlags", e));
    }
    return static_cast<CudaStream>(stream);
  }
  void destroy_stream(CudaStream stream) override {
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  Status stream_wait_event(CudaStream stream, CudaEvent event) override {
    if (cudaError_t e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                            static_cast<cudaEvent_t>(event), 0);
        e != cudaSuccess) {
      return InvalidArgument(cuda_error_text("cudaStreamWaitEvent(after_cuda_event)", e));
    }
    return Status::Ok();
  }
  Status copy_async(void* dst, const void* src, uint64_t bytes, CudaCopyDirection direction,
                    CudaStream stream) override {
    const cudaMemcpyKind kind = direction == CudaCopyDirection::kDeviceToHost
                                    ? cudaMemcpyDeviceToHost
                                    : cudaMemcpyHostToDevice;
    if (cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      return Internal(cuda_error_text("cudaMemcpyAsync", e));
    }
    return Status::Ok();
  }
  Result<CudaEvent> record_event(CudaStream stream) override {
    cudaEvent_t event = nullptr;
    // Blocking sync: a waiting thread sleeps in cudaEventSynchronize instead of spinning.
    if (cudaError_t e =
            cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming);
        e != cudaSuccess) {
      return Internal(cuda_error_text("cudaEventCreateWithFlags", e));
    }
    if (cudaError_t e = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      cudaEventDestroy(event);
      return Internal(cuda_error_text("cudaEventRecord", e));
    }
    return static_cast<CudaEvent>(event);
  }
  Status wait_event(CudaEvent event) override {
    if (cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(event)); e != cudaSuccess) {
      return Internal(cuda_error_text("cudaEventSynchronize (a staging copy failed)", e));
    }
    return Status::Ok();
  }
  void destroy_event(CudaEvent event) override {
    cudaEventDestroy(static_cast<cudaEvent_t>(event));
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
