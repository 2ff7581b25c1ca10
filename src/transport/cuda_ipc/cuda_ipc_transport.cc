#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include "core/logging.h"
#include "transport/cuda_ipc/cuda_region_export.h"

namespace kvferry::cuda_ipc {

CudaIpcTransport::CudaIpcTransport(std::unique_ptr<CudaMemoryApi> api)
    : api_(std::move(api)), cache_(*api_), queue_(std::make_unique<CudaCopyQueue>()) {}

Result<CudaIpcBacking> CudaIpcTransport::export_region(void* addr, uint64_t length,
                                                       MemoryLocation location) {
  return export_cuda_region(*api_, addr, length, location);
}

int batch_device(const ResolvedBatch& batch, const RegionIndex& local, const RegionIndex& remote) {
  size_t hint = 0;
  for (const ResolvedOp& span : batch.spans) {
    // Local regions are indexed by their own address, which is their pointer here.
    const RegionEntry* l = local.find(reinterpret_cast<uint64_t>(span.local), span.length, hint);
    if (l != nullptr && l->location.kind == MemoryLocation::Kind::kCuda) return l->location.device;
    size_t remote_hint = 0;
    const RegionEntry* r = remote.find(span.remote_addr, span.length, remote_hint);
    if (r != nullptr && r->location.kind == MemoryLocation::Kind::kCuda) return r->location.device;
  }
  return 0;
}

Status CudaIpcTransport::post(const std::shared_ptr<detail::BatchRecord>& batch,
                              const detail::DevicePostContext& context) {
  std::vector<std::shared_ptr<const IpcMapping>> mappings;
  KVF_RETURN_IF_ERROR(map_remote_device_spans(batch->work, *context.remote, cache_,
                                              context.peer_incarnation, mappings));
  const int device = batch_device(batch->work, *context.local, *context.remote);
  std::vector<std::shared_ptr<const void>> keep_alive(mappings.begin(), mappings.end());
  return queue_->post(batch, device, context.after_cuda_event, std::move(keep_alive));
}

void CudaIpcTransport::forget_peer(uint64_t incarnation) {
  if (size_t n = cache_.forget(incarnation); n > 0) {
    log().info("cuda_ipc: dropped {} IPC handle(s) of peer incarnation {:016x}", n, incarnation);
  }
}

}  // namespace kvferry::cuda_ipc

namespace kvferry::detail {

bool device_transport_built() { return true; }

Result<std::unique_ptr<DeviceTransport>> open_device_transport() {
  KVF_ASSIGN_OR_RETURN(auto api, cuda_ipc::open_cuda_runtime_memory_api());
  return std::unique_ptr<DeviceTransport>(new cuda_ipc::CudaIpcTransport(std::move(api)));
}

}  // namespace kvferry::detail
