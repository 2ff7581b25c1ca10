#include "transport/cma/cma_transport.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/logging.h"
#include "transport/cma/cma_copier.h"
#include "transport/cma/cma_session.h"
#include "transport/local/copy_executor.h"

namespace kvferry {
namespace {

// cma splits from 2 MiB, below the memcpy transports' 4 MiB: its copy is a system call that
// moves ~14 GB/s on one core (docs/PERFORMANCE.md, "cma against memcpy and the bare system call"),
// so a second thread pays where a cache-resident memcpy does not (4 MiB x 1: 17-19 GB/s
// split, 13-15 GB/s inline).
constexpr uint64_t kCmaInlineBatchBytes = 2u << 20;

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
  CmaTransport(const TransportEnv& env, std::unique_ptr<CmaSessionHub> hub)
      : env_(env), hub_(std::move(hub)) {}

  TransportKind kind() const override { return TransportKind::kCma; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = CopyAccess::kRemoteAddress;  // the peer's range by its own address
    caps.may_copy_in_post = true;              // small parts copy on the submitting thread
    return caps;
  }
  void describe(SegmentDescriptor& self) const override { self.cma_socket = hub_->name(); }
  // Host memory (plain or allocate_shared) is declared to same-host sessions as it comes and
  // revoked as it goes; device memory is never cma's.
  Status register_region(RegionEntry& entry) override {
    if (entry.kind() != MemoryKind::kDevice) hub_->declare({entry.addr, entry.length});
    return Status::Ok();
  }
  void unregister_region(const RegionEntry& entry) override { unregister_regions({&entry, 1}); }
  void unregister_regions(std::span<const RegionEntry> entries) override {
    std::vector<CmaRange> ranges;
    for (const RegionEntry& e : entries) {
      if (e.kind() != MemoryKind::kDevice) ranges.push_back({e.addr, e.length});
    }
    hub_->revoke(ranges);
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
    if (peer.cma_socket.empty()) return "the peer serves no cma socket to prove who it is";
    return "";
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo& peer) override {
    if (peer.place != PeerPlace::kSameHost || peer.descriptor.cma_socket.empty()) {
      return std::shared_ptr<TransportLink>(std::make_shared<UnroutedLink>());
    }
    // The pid, its pidfd and the ranges come from the target's engine over a socket the
    // kernel names the owner of; the descriptor's claims are only checked against them.
    Result<std::shared_ptr<CmaVerifiedPeer>> verified =
        hub_->open(peer.descriptor.cma_socket, peer.name, peer.descriptor.pid,
                   peer.descriptor.incarnation, peer.liveness);
    if (!verified.ok()) {
      log().warn("peer {}: cma refused: {}; its host memory takes the next route", peer.name,
                 verified.status().message());
      return verified.status();
    }
    if ((*verified)->pidfd() < 0) {
      log().warn("peer {}: no pidfd in this kernel: cma cannot notice pid reuse", peer.name);
    }
    if (std::string why = probe_cma((*verified)->pid(), (*verified)->first_address());
        !why.empty()) {
      log().warn("peer {}: cma refused: {}; its host memory takes the next route", peer.name, why);
      (*verified)->close("the kernel refused cross-memory attach", /*tell_peer=*/false);
      return PeerUnreachable("cma probe refused: " + why);
    }
    auto copier = std::make_shared<const CmaCopier>(std::move(*verified));
    KVF_RETURN_IF_ERROR(copier->check_alive());
    auto executor = std::make_shared<CopyExecutor>(
        *env_.workers, std::min(env_.inline_batch_bytes, kCmaInlineBatchBytes), std::move(copier));
    return std::shared_ptr<TransportLink>(std::make_shared<CopyLink>(std::move(executor)));
  }
  void forget_peer(uint64_t incarnation) override { hub_->forget(incarnation); }

 private:
  TransportEnv env_;
  std::unique_ptr<CmaSessionHub> hub_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_cma_transport(const TransportEnv& env) {
  if (env.workers == nullptr) return InvalidArgument("cma transport needs the engine's workers");
  CmaSessionHub::Options options;
  options.incarnation = env.incarnation;
  options.secret = env.secret;
  options.io_timeout = env.connect_timeout;
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<CmaSessionHub> hub, CmaSessionHub::start(options));
  return std::unique_ptr<Transport>(new CmaTransport(env, std::move(hub)));
}

}  // namespace kvferry
