#include "transport/shm/shm_transport.h"

#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

class ShmTransport final : public CopyTransport {
 public:
  explicit ShmTransport(const TransportEnv& env) : CopyTransport(env, true) {}
  TransportKind kind() const override { return TransportKind::kShm; }
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
};

}  // namespace

Result<std::unique_ptr<Transport>> make_shm_transport(const TransportEnv& env) {
  return std::unique_ptr<Transport>(new ShmTransport(env));
}

}  // namespace kvferry
