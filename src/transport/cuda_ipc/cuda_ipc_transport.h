// CudaIpcTransport: the engine's DeviceTransport in a CUDA build (contract in
// engine/device_transport.h). Registration exports IPC handles (export_cuda_region); a
// batch opens the peer's handles it needs through the IpcHandleCache, then runs on the
// CudaCopyQueue.
//
// Ownership: owns the runtime API, the handle cache and the copy queue; destroyed in the
// reverse order, so the queue's last batches (and the mappings they hold) end before the
// cache and the API go.
//
// Thread-safety: all methods may be called concurrently.
#pragma once

#include <memory>

#include "engine/device_transport.h"
#include "transport/cuda_ipc/cuda_copy_queue.h"
#include "transport/cuda_ipc/cuda_memory_api.h"
#include "transport/cuda_ipc/ipc_handle_cache.h"

namespace kvferry::cuda_ipc {

class CudaIpcTransport final : public detail::DeviceTransport {
 public:
  explicit CudaIpcTransport(std::unique_ptr<CudaMemoryApi> api);

  Result<CudaIpcBacking> export_region(void* addr, uint64_t length,
                                       MemoryLocation location) override;
  Status post(const std::shared_ptr<detail::BatchRecord>& batch,
              const detail::DevicePostContext& context) override;
  void forget_peer(uint64_t incarnation) override;

 private:
  std::unique_ptr<CudaMemoryApi> api_;
  IpcHandleCache cache_;
  std::unique_ptr<CudaCopyQueue> queue_;
};

// The device a batch runs on: that of the first span's local region when it is device
// memory, else that of its remote region, else 0.
int batch_device(const ResolvedBatch& batch, const RegionIndex& local, const RegionIndex& remote);

}  // namespace kvferry::cuda_ipc
