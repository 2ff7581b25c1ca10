// PeerState: what the engine knows about one opened peer — its descriptor, the regions
// this process can reach, the transport chosen for it, and whether it is still alive.
//
// Thread-safety: `segment` is swapped atomically on refresh; `disconnected` is set once
// by the peer monitor (or a refresh that sees a new incarnation) and read by the data path.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/region_index.h"
#include "kvferry/transport_kind.h"
#include "metadata/segment_descriptor.h"
#include "transport/shm/shm_mapping.h"

namespace kvferry::detail {

class TcpLink;

// One snapshot of a peer's descriptor with the mappings that back its regions.
struct RemoteSegment {
  SegmentDescriptor descriptor;
  RegionIndex regions;
  std::vector<std::shared_ptr<ShmMapping>> mappings;  // keep host_ptrs valid
};

// Whether a peer is still usable. Shared with the batches to it (which must not own the
// PeerState: its tcp lanes' threads would then end up destroying themselves).
class PeerLiveness {
 public:
  explicit PeerLiveness(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  bool is_disconnected() const { return disconnected_.load(std::memory_order_acquire); }
  void mark_disconnected(std::string reason) {
    std::lock_guard lock(reason_mu_);
    if (disconnected_.load()) return;
    reason_ = std::move(reason);
    disconnected_.store(true, std::memory_order_release);
  }
  std::string disconnect_reason() const {
    std::lock_guard lock(reason_mu_);
    return reason_;
  }

 private:
  std::string name_;
  std::atomic<bool> disconnected_{false};
  mutable std::mutex reason_mu_;
  std::string reason_;
};

struct PeerState {
  explicit PeerState(std::string peer_name)
      : name(std::move(peer_name)), liveness(std::make_shared<PeerLiveness>(name)) {}
  const std::string name;
  std::shared_ptr<PeerLiveness> liveness;
  TransportKind transport = TransportKind::kLocal;
  bool is_self = false;
  uint64_t incarnation = 0;
  int64_t pid = 0;
  std::atomic<std::shared_ptr<const RemoteSegment>> segment;  // null for the self peer
  std::shared_ptr<TcpLink> tcp;                               // set when transport == kTcp
  std::mutex refresh_mu;                                      // one descriptor refresh at a time

  bool is_disconnected() const { return liveness->is_disconnected(); }
  void mark_disconnected(std::string reason) { liveness->mark_disconnected(std::move(reason)); }
  std::string disconnect_reason() const { return liveness->disconnect_reason(); }
};

}  // namespace kvferry::detail
