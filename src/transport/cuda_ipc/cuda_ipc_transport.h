// The cuda_ipc transport: ops that touch device memory, on this engine (the self peer) or a
// same-host peer, as device copies. Registration exports an IPC handle of each device region
// (export_cuda_region); a batch part opens the peer's handles it needs through the
// IpcHandleCache, then runs on the CudaCopyQueue.
//
// CUDA is initialised only on first need — a device region registered, or a route with
// device memory considered — so engines that never touch device memory never load it. When
// no device is usable, every device route says why (why_not) and device registration fails
// with that reason.
//
// Ownership: CudaIpcDevice owns the runtime API, the handle cache and the copy queue;
// destroyed in the reverse order, so the queue's last batches (and the mappings they hold)
// end before the cache and the API go.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <memory>
#include <span>

#include "transport/cuda_ipc/cuda_copy_queue.h"
#include "transport/cuda_ipc/ipc_handle_cache.h"
#include "transport/cuda_memory_api.h"
#include "transport/transport.h"

namespace kvferry::cuda_ipc {

// The opened device side: what the transport needs once CUDA is up.
class CudaIpcDevice {
 public:
  // The device side over `api`, its copy queue running; Internal when the queue's thread
  // cannot start.
  static Result<std::unique_ptr<CudaIpcDevice>> open(std::unique_ptr<CudaMemoryApi> api);
  CudaIpcDevice(std::unique_ptr<CudaMemoryApi> api, std::unique_ptr<CudaCopyQueue> queue);
  Result<CudaIpcBacking> export_region(void* addr, uint64_t length, MemoryLocation location);
  Status post(const BatchPart& part);
  void forget_peer(uint64_t incarnation);

 private:
  std::unique_ptr<CudaMemoryApi> api_;
  IpcHandleCache cache_;
  std::unique_ptr<CudaCopyQueue> queue_;
};

// The device a batch part runs on: that of the first span's local region when it is device
// memory, else that of its remote region, else 0.
int batch_device(std::span<const ResolvedOp> spans, const RegionIndex& local,
                 const RegionIndex& remote);

// The transport; `open` brings the device side up on first need (the CUDA runtime in a
// build; a fake in tests).
using CudaIpcDeviceOpener = std::function<Result<std::unique_ptr<CudaIpcDevice>>()>;
std::unique_ptr<Transport> make_cuda_ipc_transport(CudaIpcDeviceOpener open);

}  // namespace kvferry::cuda_ipc

namespace kvferry {
// The cuda_ipc transport over the CUDA runtime.
Result<std::unique_ptr<Transport>> make_cuda_ipc_transport(const TransportEnv& env);
}  // namespace kvferry
