#include "transport/local/local_transport.h"

#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

class LocalTransport final : public CopyTransport {
 public:
  explicit LocalTransport(const TransportEnv& env) : CopyTransport(env, false) {}
  TransportKind kind() const override { return TransportKind::kLocal; }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor&) const override {
    if (place != PeerPlace::kSelf) return "local only reaches this engine itself";
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return "local copies host memory only (device memory goes over cuda_ipc)";
    }
    return "";
  }
};

}  // namespace

Result<std::unique_ptr<Transport>> make_local_transport(const TransportEnv& env) {
  return std::unique_ptr<Transport>(new LocalTransport(env));
}

}  // namespace kvferry
