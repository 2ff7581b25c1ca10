#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/host_identity.h"
#include "core/logging.h"
#include "engine/engine_impl.h"
#include "engine/route_choice.h"
#include "metadata/handshake.h"

namespace kvferry::detail {

Result<PeerHandle> EngineImpl::open_peer(std::string_view name, const PeerOptions& options) {
  KVF_RETURN_IF_ERROR(parse_endpoint(name).status());
  std::optional<TransportKind> forced =
      options.transport ? options.transport : options_.forced_transport;
  const bool forced_tcp = forced == TransportKind::kTcp;  // tcp may reach even ourselves
  if (std::find(endpoints_.begin(), endpoints_.end(), name) != endpoints_.end() && !forced_tcp) {
    if (forced && *forced != TransportKind::kLocal) {
      return NotSupported(
          fmt::format("forced transport {} cannot reach {}: it is this engine "
                      "itself (only local can)",
                      transport_kind_name(*forced), name));
    }
    return PeerHandle(self_peer_);
  }
  std::string key(name);
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(key);
    if (it != peers_.end() && !it->second->is_disconnected() && it->second->forced == forced) {
      return PeerHandle(it->second);
    }
  }
  KVF_ASSIGN_OR_RETURN(auto peer, connect_peer(key, options));
  std::optional<uint64_t> replaced;
  {
    std::lock_guard lock(peers_mu_);
    auto& slot = peers_[key];
    if (slot && slot->incarnation != peer->incarnation) replaced = slot->incarnation;
    slot = peer;
  }
  // The peer restarted: what was opened for its previous incarnation is of no use.
  if (replaced) forget_incarnation(*replaced);
  return PeerHandle(peer);
}

void EngineImpl::close_peer(const PeerHandle& handle) {
  if (!handle.valid() || handle.state_->is_self) return;
  // First: what was queued for the peer is still delivered (the sender drains it), and a
  // sender that sees the peer disconnected before it knows it is closing would fail it.
  drop_notification_sender(handle.state_->name, PeerDisconnected("peer " + handle.state_->name +
                                                                 " closed by this engine"));
  handle.state_->mark_disconnected("closed by this engine");
  // Its links close now (tcp lanes): what they carry fails with PeerDisconnected.
  for (const auto& link : handle.state_->links) {
    if (link) link->shutdown();
  }
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle.state_->name);
    if (it != peers_.end() && it->second == handle.state_) peers_.erase(it);
  }
  forget_incarnation(handle.state_->incarnation);
}

void reach_through(SegmentDescriptor& d, std::string_view host) {
  d.tcp_endpoint = reachable_via(d.tcp_endpoint, host);
  d.notify_endpoint = reachable_via(d.notify_endpoint, host);
}

Result<SegmentDescriptor> EngineImpl::fetch_descriptor(const Endpoint& peer,
                                                       Clock::time_point deadline) const {
  KVF_ASSIGN_OR_RETURN(std::string json, store_->fetch(peer.to_string(), deadline));
  KVF_ASSIGN_OR_RETURN(SegmentDescriptor d, parse_segment_descriptor(json));
  reach_through(d, peer.host);
  return d;
}

Status EngineImpl::probe_peer(std::string_view name, std::chrono::milliseconds timeout) {
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(name));
  return fetch_descriptor(endpoint, Clock::now() + timeout).status();
}

Result<std::shared_ptr<PeerState>> EngineImpl::connect_peer(const std::string& name,
                                                            const PeerOptions& options) {
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(name));
  KVF_ASSIGN_OR_RETURN(SegmentDescriptor d,
                       fetch_descriptor(endpoint, Clock::now() + options_.handshake_timeout));
  std::optional<TransportKind> forced =
      options.transport ? options.transport : options_.forced_transport;
  const bool is_self = d.incarnation == incarnation_;
  if (is_self && forced != TransportKind::kTcp) return self_peer_;  // another name for us
  const bool same_host = d.host_id == host_identity();
  auto peer = std::make_shared<PeerState>(name);
  peer->place = is_self     ? PeerPlace::kSelf
                : same_host ? PeerPlace::kSameHost
                            : PeerPlace::kOtherHost;
  peer->forced = forced;
  peer->incarnation = d.incarnation;
  peer->pid = d.pid;
  connect_links(*peer, d);
  // Its shared memory is mapped first: a peer that will not hand this process its memfds
  // (another user without the secret, another network namespace) is reached by the next
  // route, and a forced shm gets the typed refusal.
  Result<std::shared_ptr<const RemoteSegment>> segment =
      attach_segment(d, nullptr, maps_remote_host_memory(*peer));
  const TransportLink* shm_link = peer->link(TransportKind::kShm);
  if (!segment.ok() && shm_link != nullptr &&
      (segment.status().code() == StatusCode::kUnauthenticated ||
       segment.status().code() == StatusCode::kNotSupported)) {
    if (forced == TransportKind::kShm) {
      return Status(segment.status().code(),
                    fmt::format("forced transport shm cannot reach peer {}: {}", name,
                                segment.status().message()));
    }
    peer->shm_refused =
        "the peer's shared memory cannot be mapped here: " + segment.status().message();
    log().warn("peer {}: shm is out, its shared memory goes by the next route: {}", name,
               segment.status().message());
    connect_links(*peer, d);
    segment = attach_segment(d, nullptr, maps_remote_host_memory(*peer));
  }
  if (!segment.ok()) return segment.status();
  // A peer nothing reaches is refused now. Routes to device memory are asked only when the
  // peer advertises some (or a transport is forced): asking one initialises CUDA.
  const bool ask_device = forced.has_value() || advertises(d, MemoryKind::kDevice);
  const Route* reachable = nullptr;
  for (MemoryKind local : {MemoryKind::kHost, MemoryKind::kDevice}) {
    for (MemoryKind remote : {MemoryKind::kSharedHost, MemoryKind::kHost, MemoryKind::kDevice}) {
      const bool device = local == MemoryKind::kDevice || remote == MemoryKind::kDevice;
      if (reachable != nullptr || (device && !ask_device)) continue;
      const Route& r = peer->routes.get({local, remote});
      if (r.transport) reachable = &r;
    }
  }
  if (reachable == nullptr) {
    const Route& host = peer->routes.get({MemoryKind::kHost, MemoryKind::kHost});
    if (peer->identity_refused) {
      return Unauthenticated(
          fmt::format("cannot reach peer {}: {}", name, peer->identity_refused->message()));
    }
    return NotSupported(fmt::format("cannot reach peer {}: {}", name, host.reason));
  }
  peer->segment.store(std::move(*segment));
  // A same-host peer's death is seen through its pidfd; across hosts, through its
  // connections.
  if (same_host && !is_self) KVF_RETURN_IF_ERROR(monitor_.watch(peer));
  log().info("peer {} ('{}', pid {}, {}): opened{}", name, peer->segment.load()->descriptor.name,
             peer->pid, same_host ? "same host" : "other host",
             forced ? fmt::format("; every route forced to {}", transport_kind_name(*forced)) : "");
  return peer;
}

void EngineImpl::connect_links(PeerState& peer, const SegmentDescriptor& d) {
  std::array<const Transport*, kAllTransportKinds.size()> served{};
  std::array<std::string, kAllTransportKinds.size()> link_errors;
  PeerInfo info{d, peer.name, peer.liveness, peer.place};
  for (size_t i = 0; i < transports_.size(); ++i) {
    Transport* t = transports_[i].get();
    if (t == nullptr) continue;
    served[i] = t;
    if (!d.transports.contains(t->kind())) continue;
    if (t->kind() == TransportKind::kShm && !peer.shm_refused.empty()) {
      peer.links[i].reset();
      link_errors[i] = peer.shm_refused;
      continue;
    }
    Result<std::shared_ptr<TransportLink>> link = t->connect(info);
    if (link.ok()) {
      peer.links[i] = std::move(*link);
    } else {
      link_errors[i] = link.status().message();
      if (link.status().code() == StatusCode::kUnauthenticated && !peer.identity_refused) {
        peer.identity_refused = link.status();
      }
    }
  }
  // What routes depend on (served transports, endpoints, host) is fixed per incarnation, so
  // the chooser keeps the descriptor as first seen, without its regions (routes are chosen
  // by memory kind; a link that needs the regions has them from connect()).
  SegmentDescriptor identity = d;
  identity.regions.clear();
  peer.routes.set_chooser(peer.name, [served, link_errors, d = std::move(identity),
                                      place = peer.place, forced = peer.forced](RouteKey key) {
    RouteChoiceInput input;
    input.served = served;
    input.link_errors = link_errors;
    input.place = place;
    input.forced = forced;
    return choose_route(key, d, input);
  });
}

// A peer whose routes are forced to a transport that does not map memory never has its
// memory mapped: mapping (with MAP_POPULATE) costs a page table entry per page of the peer's
// pool, and a forced-tcp peer never reads it.
bool EngineImpl::maps_remote_host_memory(const PeerState& peer) const {
  if (peer.place != PeerPlace::kSameHost || !peer.shm_refused.empty()) return false;
  for (size_t i = 0; i < transports_.size(); ++i) {
    if (!peer.links[i] || (peer.forced && transports_[i]->kind() != *peer.forced)) continue;
    if (transports_[i]->capabilities().maps_remote_host_memory) return true;
  }
  return false;
}

TransportKind EngineImpl::preferred_transport(const PeerHandle& h) {
  PeerState& peer = *h.state_;
  auto segment = peer.segment.load();
  for (MemoryKind remote : {MemoryKind::kDevice, MemoryKind::kSharedHost, MemoryKind::kHost}) {
    // The self peer has no segment: its memory is ours, host memory at least.
    const bool advertised =
        segment ? advertises(segment->descriptor, remote) : remote != MemoryKind::kDevice;
    if (!advertised) continue;
    const Route& r = peer.routes.get({MemoryKind::kHost, remote});
    if (r.transport) return *r.transport;
  }
  const Route& host = peer.routes.get({MemoryKind::kHost, MemoryKind::kHost});
  return host.transport.value_or(peer.forced.value_or(TransportKind::kLocal));
}

std::vector<Route> EngineImpl::routes(const PeerHandle& h) {
  std::vector<Route> out;
  for (size_t l = 0; l < kMemoryKindCount; ++l) {
    for (size_t r = 0; r < kMemoryKindCount; ++r) {
      out.push_back(h.state_->routes.get({static_cast<MemoryKind>(l), static_cast<MemoryKind>(r)}));
    }
  }
  return out;
}

Result<std::shared_ptr<const RemoteSegment>> EngineImpl::attach_segment(
    SegmentDescriptor d, const RemoteSegment* previous, bool map_shm) const {
  auto segment = std::make_shared<RemoteSegment>();
  RegionEntries entries;
  entries.reserve(d.regions.size());
  for (const RegionDescriptor& r : d.regions) {
    RegionEntry entry{r.addr, r.length, nullptr, r.location, r.shm, nullptr, r.cuda, r.ucx_rkey};
    if (r.shm && map_shm) {
      std::shared_ptr<ShmMapping> mapping;
      auto reuse = [&](const std::vector<std::shared_ptr<ShmMapping>>& pool) {
        for (const auto& m : pool) {
          if (m->inode() == r.shm->inode && m->bytes() == r.shm->file_bytes) return m;
        }
        return std::shared_ptr<ShmMapping>();
      };
      mapping = reuse(segment->mappings);
      if (!mapping && previous != nullptr) mapping = reuse(previous->mappings);
      if (!mapping) {
        if (d.shm_socket.empty()) {
          return NotSupported("the peer serves no shm socket to hand out its memfds");
        }
        KVF_ASSIGN_OR_RETURN(Fd memfd, fetch_shm_fd(d.shm_socket, d.pid, r.shm->inode, secret_,
                                                    Clock::now() + options_.handshake_timeout));
        KVF_ASSIGN_OR_RETURN(
            mapping,
            ShmMapping::open(std::move(memfd), "memfd inode " + std::to_string(r.shm->inode),
                             r.shm->file_bytes, r.shm->inode));
      }
      if (std::find(segment->mappings.begin(), segment->mappings.end(), mapping) ==
          segment->mappings.end()) {
        segment->mappings.push_back(mapping);
      }
      entry.host_ptr = mapping->base() + r.shm->file_offset;
      // Inside the mapping: the parser checked the word lies inside file_bytes.
      entry.shm_guard =
          reinterpret_cast<uint64_t*>(mapping->base() + r.shm->guard_offset) + r.shm->guard_slot;
    }
    entries.push_back(std::move(entry));
  }
  segment->regions = RegionIndex(std::move(entries));
  segment->descriptor = std::move(d);
  return std::shared_ptr<const RemoteSegment>(std::move(segment));
}

Status EngineImpl::refresh_peer(PeerState& peer, Clock::time_point batch_deadline) {
  // Another batch's refresh in progress is waited for only until this batch's deadline.
  {
    std::unique_lock lock(peer.refresh_mu);
    if (!peer.refresh_cv.wait_until(lock, batch_deadline, [&] { return !peer.refreshing; })) {
      return Timeout("refreshing the descriptor of peer " + peer.name +
                     " did not finish before the batch deadline");
    }
    peer.refreshing = true;
  }
  struct EndRefresh {
    PeerState& peer;
    ~EndRefresh() {
      {
        std::lock_guard lock(peer.refresh_mu);
        peer.refreshing = false;
      }
      peer.refresh_cv.notify_all();
    }
  } end_refresh{peer};
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(peer.name));
  KVF_ASSIGN_OR_RETURN(
      SegmentDescriptor d,
      fetch_descriptor(endpoint,
                       std::min(Clock::now() + options_.handshake_timeout, batch_deadline)));
  if (d.incarnation != peer.incarnation) {
    std::string why = fmt::format("restarted (incarnation {:016x} -> {:016x}); open it again",
                                  peer.incarnation, d.incarnation);
    peer.mark_disconnected(why);
    forget_incarnation(peer.incarnation);
    return PeerDisconnected("peer " + peer.name + " " + why);
  }
  auto previous = peer.segment.load();
  if (previous && d.version <= previous->descriptor.version) return Status::Ok();
  KVF_ASSIGN_OR_RETURN(auto segment,
                       attach_segment(std::move(d), previous.get(), maps_remote_host_memory(peer)));
  peer.segment.store(std::move(segment));
  return Status::Ok();
}

}  // namespace kvferry::detail
