#include "transport/cuda_ipc/cuda_ipc_transport.h"

#include <fmt/format.h>

#include <mutex>

#include "core/logging.h"
#include "transport/cuda_ipc/cuda_region_export.h"
#include "transport/cuda_ipc/cuda_runtime_memory_api.h"

namespace kvferry::cuda_ipc {

Result<std::unique_ptr<CudaIpcDevice>> CudaIpcDevice::open(std::unique_ptr<CudaMemoryApi> api) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<CudaCopyQueue> queue, CudaCopyQueue::start());
  return std::make_unique<CudaIpcDevice>(std::move(api), std::move(queue));
}

CudaIpcDevice::CudaIpcDevice(std::unique_ptr<CudaMemoryApi> api,
                             std::unique_ptr<CudaCopyQueue> queue)
    : api_(std::move(api)), cache_(*api_), queue_(std::move(queue)) {}

Result<CudaIpcBacking> CudaIpcDevice::export_region(void* addr, uint64_t length,
                                                    MemoryLocation location) {
  return export_cuda_region(*api_, addr, length, location);
}

int batch_device(std::span<const ResolvedOp> spans, const RegionIndex& local,
                 const RegionIndex& remote) {
  size_t hint = 0;
  for (const ResolvedOp& span : spans) {
    // Local regions are indexed by their own address, which is their pointer here.
    const RegionEntry* l = local.find(reinterpret_cast<uint64_t>(span.local), span.length, hint);
    if (l != nullptr && l->location.kind == MemoryLocation::Kind::kCuda) return l->location.device;
    size_t remote_hint = 0;
    const RegionEntry* r = remote.find(span.remote_addr, span.length, remote_hint);
    if (r != nullptr && r->location.kind == MemoryLocation::Kind::kCuda) return r->location.device;
  }
  return 0;
}

Status CudaIpcDevice::post(const BatchPart& part) {
  std::vector<std::shared_ptr<const IpcMapping>> mappings;
  KVF_RETURN_IF_ERROR(
      map_remote_device_spans(part.spans, *part.remote, cache_, part.peer_incarnation, mappings));
  const int device = batch_device(part.spans, *part.local, *part.remote);
  std::vector<std::shared_ptr<const void>> keep_alive(mappings.begin(), mappings.end());
  return queue_->post(part, device, std::move(keep_alive));
}

void CudaIpcDevice::forget_peer(uint64_t incarnation) {
  if (size_t n = cache_.forget(incarnation); n > 0) {
    log().info("cuda_ipc: dropped {} IPC handle(s) of peer incarnation {:016x}", n, incarnation);
  }
}

namespace {

class CudaIpcTransport;

class CudaIpcLink final : public TransportLink {
 public:
  explicit CudaIpcLink(CudaIpcTransport& transport) : transport_(transport) {}
  Status post(const BatchPart& part) override;

 private:
  CudaIpcTransport& transport_;  // outlives every link (the engine destroys peers first)
};

class CudaIpcTransport final : public Transport {
 public:
  explicit CudaIpcTransport(CudaIpcDeviceOpener open) : open_(std::move(open)) {}

  TransportKind kind() const override { return TransportKind::kCudaIpc; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kDevicePointers;
    caps.reaches_local_device = true;
    caps.maps_remote_host_memory = true;
    return caps;
  }
  Status prepare_region(RegionEntry& entry) override {
    KVF_ASSIGN_OR_RETURN(CudaIpcDevice * d, device());
    KVF_ASSIGN_OR_RETURN(entry.cuda,
                         d->export_region(entry.host_ptr, entry.length, entry.location));
    return Status::Ok();
  }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor& peer) const override {
    if (place == PeerPlace::kOtherHost) {
      return "the peer is on another host (host id " + peer.host_id + ")";
    }
    if (key.local != MemoryKind::kDevice && key.remote != MemoryKind::kDevice) {
      return "no device memory on either side";
    }
    if (key.remote == MemoryKind::kHost && place != PeerPlace::kSelf) {
      return "the peer's host memory is not shareable (allocate it with allocate_shared)";
    }
    // Asked last: it initialises CUDA.
    Result<CudaIpcDevice*> d = device();
    return d.ok() ? "" : d.status().message();
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo&) override {
    return std::shared_ptr<TransportLink>(std::make_shared<CudaIpcLink>(*this));
  }
  void forget_peer(uint64_t incarnation) override {
    // Only a device already open can hold anything of the peer: never open one here.
    if (CudaIpcDevice* d = ready_.load()) d->forget_peer(incarnation);
  }

  Result<CudaIpcDevice*> device() const {
    std::call_once(once_, [this] {
      Result<std::unique_ptr<CudaIpcDevice>> opened = open_();
      if (opened.ok()) {
        device_ = std::move(*opened);
        ready_.store(device_.get());
      } else {
        error_ = opened.status();
        log().info("device memory unavailable: {}", error_.message());
      }
    });
    if (device_) return device_.get();
    return error_;
  }

 private:
  CudaIpcDeviceOpener open_;
  mutable std::once_flag once_;
  mutable std::unique_ptr<CudaIpcDevice> device_;       // set once under once_
  mutable Status error_;                                // why device_ is null
  mutable std::atomic<CudaIpcDevice*> ready_{nullptr};  // device_, once opened
};

Status CudaIpcLink::post(const BatchPart& part) {
  KVF_ASSIGN_OR_RETURN(CudaIpcDevice * d, transport_.device());
  return d->post(part);
}

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport(CudaIpcDeviceOpener open) {
  return std::make_unique<CudaIpcTransport>(std::move(open));
}

}  // namespace kvferry::cuda_ipc

namespace kvferry {

Result<std::unique_ptr<Transport>> make_cuda_ipc_transport(const TransportEnv&) {
  return cuda_ipc::make_cuda_ipc_transport(
      []() -> Result<std::unique_ptr<cuda_ipc::CudaIpcDevice>> {
        KVF_ASSIGN_OR_RETURN(auto api, cuda_ipc::open_cuda_runtime_memory_api());
        return cuda_ipc::CudaIpcDevice::open(std::move(api));
      });
}

}  // namespace kvferry
