#include "transport/local/local_transport.h"

#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

class LocalTransport final : public Transport {
 public:
  explicit LocalTransport(const TransportEnv& env)
      : copier_(std::make_shared<CopyExecutor>(*env.workers, env.inline_batch_bytes)) {}

  TransportKind kind() const override { return TransportKind::kLocal; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kHostPointers;
    caps.may_copy_in_post = true;
    return caps;
  }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor&) const override {
    if (place != PeerPlace::kSelf) return "local only reaches this engine itself";
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return "local copies host memory only (device memory goes over cuda_ipc)";
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

Result<std::unique_ptr<Transport>> make_local_transport(const TransportEnv& env) {
  return std::unique_ptr<Transport>(new LocalTransport(env));
}

}  // namespace kvferry
