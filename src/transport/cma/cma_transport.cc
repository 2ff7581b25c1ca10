#include "transport/cma/cma_transport.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/logging.h"
#include "transport/cma/cma_copier.h"
#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

// cma splits from 2 MiB, below the memcpy transports' 4 MiB: its copy is a system call that
// moves ~14 GB/s on one core (docs/PERFORMANCE.md, "Issue 16", "shm: splitting by cost"),
// so a second thread pays where a cache-resident memcpy does not (4 MiB x 1: 17-19 GB/s
// split, 13-15 GB/s inline).
constexpr uint64_t kCmaInlineBatchBytes = 2u << 20;

// A host region the peer advertises, to probe with (its first byte), if any.
std::optional<uint64_t> probe_address(const SegmentDescriptor& peer) {
  for (const RegionDescriptor& r : peer.regions) {
    if (r.kind() != MemoryKind::kDevice && r.length > 0) return r.addr;
  }
  return std::nullopt;
}

// A link whose transport never carries a route (the peer is not on this host): why_not
// refuses every route first, so post() is never called with a part.
class UnroutedLink final : public TransportLink {
 public:
  Status post(const BatchPart&) override {
    return Internal("cma: a part was posted to a peer that is not on this host");
  }
};

class CmaTransport final : public Transport {
 public:
  explicit CmaTransport(const TransportEnv& env) : env_(env) {}

  TransportKind kind() const override { return TransportKind::kCma; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kRemoteAddress;  // the peer's range by its own address
    caps.may_copy_in_post = true;              // small parts copy on the submitting thread
    return caps;
  }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor& peer) const override {
    if (place == PeerPlace::kSelf) return "it would reach this engine itself (use local)";
    if (place == PeerPlace::kOtherHost) {
      return "the peer is on another host or pid namespace (host id " + peer.host_id + ")";
    }
    if (key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice) {
      return "cma copies host memory only (same-host device memory goes over cuda_ipc)";
    }
    if (peer.pid <= 0) return fmt::format("the peer advertises no usable pid ({})", peer.pid);
    return "";
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo& peer) override {
    if (peer.place != PeerPlace::kSameHost) {
      return std::shared_ptr<TransportLink>(std::make_shared<UnroutedLink>());
    }
    const auto pid = static_cast<pid_t>(peer.descriptor.pid);
    // The pidfd first: the process the probe then validates is the one it refers to, unless
    // that one exited meanwhile (checked after the probe).
    KVF_ASSIGN_OR_RETURN(Fd pidfd, open_cma_pidfd(pid, peer.name));
    if (!pidfd.valid()) {
      log().warn("peer {}: no pidfd_open in this kernel: cma cannot notice pid reuse", peer.name);
    }
    if (std::string why = probe_cma(pid, probe_address(peer.descriptor)); !why.empty()) {
      log().warn("peer {}: cma refused: {}; its host memory takes the next route", peer.name, why);
      return PeerUnreachable("cma probe refused: " + why);
    }
    auto copier = std::make_shared<const CmaCopier>(pid, peer.name, std::move(pidfd));
    KVF_RETURN_IF_ERROR(copier->check_alive());
    auto executor = std::make_shared<CopyExecutor>(
        *env_.workers, std::min(env_.inline_batch_bytes, kCmaInlineBatchBytes), std::move(copier));
    return std::shared_ptr<TransportLink>(std::make_shared<CopyLink>(std::move(executor)));
  }

 private:
  TransportEnv env_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_cma_transport(const TransportEnv& env) {
  if (env.workers == nullptr) return InvalidArgument("cma transport needs the engine's workers");
  return std::unique_ptr<Transport>(new CmaTransport(env));
}

}  // namespace kvferry
