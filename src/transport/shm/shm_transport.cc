#include "transport/shm/shm_transport.h"

#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

class ShmTransport final : public Transport {
 public:
  explicit ShmTransport(const TransportEnv& env)
      : copier_(std::make_shared<CopyExecutor>(*env.workers, env.inline_batch_bytes)) {}

  TransportKind kind() const override { return TransportKind::kShm; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kHostPointers;
    caps.maps_remote_host_memory = true;
    caps.may_copy_in_post = true;
    return caps;
  }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor& peer) const override {
    if (place == PeerPlace::kSelf) return "it would reach this engine itself (use local)";
    if (place == PeerPlace::kOtherHost) {
      return "the peer is on another host (host id " + peer.host_id + ")";
    }
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return "shm copies host memory only (same-host device memory goes over cuda_ipc)";
    }
    if (key.remote == MemoryKind::kHost) {
      return "the peer's memory is not shareable (shm reaches only memory it allocated with "
             "allocate_shared)";
    }
    return "";
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo&) override {
    return std::shared_ptr<TransportLink>(std::make_shared<CopyLink>(copier_));
  }

 private:
  std::shared_ptr<CopyExecutor> copier_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_shm_transport(const TransportEnv& env) {
  return std::unique_ptr<Transport>(new ShmTransport(env));
}

}  // namespace kvferry
