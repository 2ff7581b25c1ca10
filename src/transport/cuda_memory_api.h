// CudaMemoryApi: every CUDA runtime call a transport makes on host-side logic, behind an
// interface free of CUDA headers, so that transports without a CUDA dependency of their own
// (tcp, which stages device memory through pinned host buffers) can use it, and tests can
// substitute a fake (tests/unit/transport/fake_cuda_memory_api.h) that runs the same logic
// on machines without a GPU.
//
// Two groups of calls:
//  * memory queries and IPC handles (cuda_ipc's registration and handle cache);
//  * staging (tcp's device path): pinned host buffers, streams, asynchronous copies between
//    host and device, and events that say when they completed.
//
// The real implementation (src/transport/cuda_ipc/cuda_runtime_memory_api.cc, CUDA builds
// only) calls libcudart; a transport gets it through TransportEnv::open_cuda_api, so only
// the CUDA build links the runtime.
//
// Thread-safety: implementations must allow concurrent calls. A stream is used by one
// thread at a time (its owner); events may be waited on from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "kvferry/status.h"
#include "metadata/segment_descriptor.h"

namespace kvferry {

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

// Opaque runtime objects (cudaStream_t, cudaEvent_t) as the interface passes them.
using CudaStream = void*;
using CudaEvent = void*;

enum class CudaCopyDirection : uint8_t { kDeviceToHost, kHostToDevice };

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

  // Staging. cudaHostAlloc (portable pinned memory) of `bytes`; free_pinned releases it.
  virtual Result<void*> alloc_pinned(uint64_t bytes) = 0;
  virtual void free_pinned(void* ptr) = 0;
  // A non-blocking stream on `device`; destroy_stream waits for nothing (the owner first
  // waits for what it enqueued).
  virtual Result<CudaStream> create_stream(int device) = 0;
  virtual void destroy_stream(CudaStream stream) = 0;
  // cudaStreamWaitEvent: later work on `stream` runs after `event` (a producer's
  // cudaEvent_t, SubmitOptions::after_cuda_event) completed.
  virtual Status stream_wait_event(CudaStream stream, CudaEvent event) = 0;
  // cudaMemcpyAsync of `bytes` on `stream` (between pinned host memory and device memory
  // of the stream's device).
  virtual Status copy_async(void* dst, const void* src, uint64_t bytes, CudaCopyDirection direction,
                            CudaStream stream) = 0;
  // An event recorded on `stream` now: it completes when everything enqueued before it has.
  virtual Result<CudaEvent> record_event(CudaStream stream) = 0;
  // Blocks until `event` completed; the copies before it succeeded when this returns OK
  // (an asynchronous copy error is reported here).
  virtual Status wait_event(CudaEvent event) = 0;
  virtual void destroy_event(CudaEvent event) = 0;
};

// How a transport opens the real API (TransportEnv::open_cuda_api): NotSupported where this
// build has no CUDA or the runtime finds no usable device.
using CudaMemoryApiOpener = std::function<Result<std::shared_ptr<CudaMemoryApi>>()>;

}  // namespace kvferry
