// PeerState: what the engine knows about one opened peer — its descriptor, the regions
// this process can reach, a link per transport both sides serve, the routes chosen for it,
// and whether it is still alive.
//
// Thread-safety: `segment` is swapped atomically on refresh; `liveness` is marked once by
// the peer monitor (or a refresh that sees a new incarnation) and read by the data path;
// routes are chosen once each, under the table's lock, and read lock-free after.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/shared_snapshot.h"
#include "kvferry/transfer_types.h"
#include "kvferry/transport_kind.h"
#include "metadata/segment_descriptor.h"
#include "transport/peer_liveness.h"
#include "transport/region_index.h"
#include "transport/shm_mapping.h"
#include "transport/transport.h"

namespace kvferry::detail {

// One snapshot of a peer's descriptor with the mappings that back its regions.
struct RemoteSegment {
  SegmentDescriptor descriptor;
  RegionIndex regions;
  std::vector<std::shared_ptr<ShmMapping>> mappings;  // keep host_ptrs valid
};

inline constexpr size_t kRouteKeyCount = kMemoryKindCount * kMemoryKindCount;
inline size_t route_index(RouteKey key) {
  return static_cast<size_t>(key.local) * kMemoryKindCount + static_cast<size_t>(key.remote);
}

// The routes of one peer, each chosen on first need by `choose` (which may initialise CUDA,
// so nothing is chosen before some op or caller needs it) and logged once.
class RouteTable {
 public:
  using Chooser = std::function<Route(RouteKey)>;
  void set_chooser(std::string peer_name, Chooser choose) {
    peer_name_ = std::move(peer_name);
    choose_ = std::move(choose);
  }
  const Route& get(RouteKey key);

 private:
  std::string peer_name_;
  Chooser choose_;
  std::mutex mu_;
  std::array<std::optional<Route>, kRouteKeyCount> routes_;        // guarded by mu_
  std::array<std::atomic<const Route*>, kRouteKeyCount> ready_{};  // routes_[i], once chosen
};

struct PeerState {
  explicit PeerState(std::string peer_name)
      : name(std::move(peer_name)), liveness(std::make_shared<PeerLiveness>(name)) {}
  const std::string name;
  std::shared_ptr<PeerLiveness> liveness;
  bool is_self = false;
  PeerPlace place = PeerPlace::kOtherHost;
  std::optional<TransportKind> forced;  // every route goes over it
  uint64_t incarnation = 0;
  int64_t pid = 0;
  SharedSnapshot<RemoteSegment> segment;  // null for the self peer
  // By TransportKind: a link for each transport both sides serve (that connected).
  std::array<std::shared_ptr<TransportLink>, kAllTransportKinds.size()> links;
  RouteTable routes;
  // One descriptor refresh at a time: `refreshing` is set while one runs (not std::timed_mutex:
  // ThreadSanitizer of gcc 12 misreads its timed lock).
  std::mutex refresh_mu;
  std::condition_variable refresh_cv;
  bool refreshing = false;  // guarded by refresh_mu
  // Why this process may not map the peer's shared memory (it refused us, or its shm socket
  // is out of reach); set once at open, before the peer is published. Empty: it may.
  std::string shm_refused;
  // A transport that found the peer is not who its descriptor says (cma: another pid or
  // incarnation on its socket); set at open. When nothing else reaches the peer, opening it
  // fails with this (Unauthenticated) rather than with NotSupported.
  std::optional<Status> identity_refused;

  TransportLink* link(TransportKind kind) const { return links[static_cast<size_t>(kind)].get(); }
  bool is_disconnected() const { return liveness->is_disconnected(); }
  void mark_disconnected(std::string reason) { liveness->mark_disconnected(std::move(reason)); }
  std::string disconnect_reason() const { return liveness->disconnect_reason(); }
};

}  // namespace kvferry::detail
