#include <fmt/format.h>

#include <algorithm>

#include "core/host_identity.h"
#include "core/logging.h"
#include "engine/engine_impl.h"
#include "engine/transport_choice.h"
#include "metadata/handshake.h"
#include "transport/tcp/tcp_link.h"

namespace kvferry::detail {

Result<PeerHandle> EngineImpl::open_peer(std::string_view name, const PeerOptions& options) {
  KVF_RETURN_IF_ERROR(parse_endpoint(name).status());
  std::optional<TransportKind> forced =
      options.transport ? options.transport : options_.forced_transport;
  const bool forced_tcp = forced == TransportKind::kTcp;  // tcp may reach even ourselves
  if (name == endpoint_ && !forced_tcp) {
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
    if (it != peers_.end() && !it->second->is_disconnected() &&
        (!forced || it->second->transport == *forced)) {
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
  handle.state_->mark_disconnected("closed by this engine");
  // Its tcp lanes close now: what they carry fails with PeerDisconnected.
  if (handle.state_->tcp) handle.state_->tcp->shutdown();
  {
    std::lock_guard lock(peers_mu_);
    auto it = peers_.find(handle.state_->name);
    if (it != peers_.end() && it->second == handle.state_) peers_.erase(it);
  }
  forget_incarnation(handle.state_->incarnation);
}

Result<std::shared_ptr<PeerState>> EngineImpl::connect_peer(const std::string& name,
                                                            const PeerOptions& options) {
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(name));
  KVF_ASSIGN_OR_RETURN(std::string json, store_->fetch(endpoint.to_string(),
                                                       Clock::now() + options_.handshake_timeout));
  KVF_ASSIGN_OR_RETURN(SegmentDescriptor d, parse_segment_descriptor(json));
  std::optional<TransportKind> forced =
      options.transport ? options.transport : options_.forced_transport;
  const bool is_self = d.incarnation == incarnation_;
  if (is_self && forced != TransportKind::kTcp) return self_peer_;  // another name for us
  KVF_ASSIGN_OR_RETURN(TransportKind transport, choose_transport(d, forced, is_self));
  const bool same_host = d.host_id == host_identity();
  auto peer = std::make_shared<PeerState>(name);
  peer->transport = transport;
  peer->incarnation = d.incarnation;
  peer->pid = d.pid;
  if (transport == TransportKind::kTcp) {
    TcpLinkOptions link;
    KVF_ASSIGN_OR_RETURN(link.endpoint, parse_endpoint(d.tcp_endpoint));
    link.peer_name = name;
    link.expected_incarnation = d.incarnation;
    link.lanes = options_.tcp_lanes;
    link.connect_timeout = options_.handshake_timeout;
    link.secret = secret_;
    peer->tcp = std::make_shared<TcpLink>(std::move(link));
  }
  // cuda_ipc maps a peer's shareable host memory too (host <-> device copies).
  const bool map_shm = transport == TransportKind::kShm || transport == TransportKind::kCudaIpc;
  KVF_ASSIGN_OR_RETURN(auto segment, attach_segment(std::move(d), nullptr, map_shm));
  peer->segment.store(std::move(segment));
  // A same-host peer's death is seen through its pidfd; across hosts, through its
  // connections.
  if (same_host && !is_self) KVF_RETURN_IF_ERROR(monitor_.watch(peer));
  const char* why = forced ? " (forced)"
                    : transport == TransportKind::kCudaIpc
                        ? " (same host, the peer advertises device memory, both serve cuda_ipc)"
                    : transport == TransportKind::kShm ? " (same host, both serve shm)"
                    : same_host ? " (same host, but not all its regions are shareable through shm)"
                                : " (other host, both serve tcp)";
  if (transport != TransportKind::kCudaIpc &&
      advertises_device_memory(peer->segment.load()->descriptor)) {
    log().warn("peer {} advertises device memory that {} cannot reach; ops to it will be refused",
               name, transport_kind_name(transport));
  }
  log().info("peer {} ('{}', pid {}): transport {}{}", name, peer->segment.load()->descriptor.name,
             peer->pid, transport_kind_name(transport), why);
  return peer;
}

Result<TransportKind> EngineImpl::choose_transport(const SegmentDescriptor& d,
                                                   std::optional<TransportKind> forced,
                                                   bool is_self) const {
  TransportChoiceInput input;
  input.served = served_;
  input.same_host = d.host_id == host_identity();
  input.is_self = is_self;
  input.forced = forced;
  input.device_usable = [this] { return device_transport().status(); };
  return detail::choose_transport(d, input);
}

Result<std::shared_ptr<const RemoteSegment>> EngineImpl::attach_segment(
    SegmentDescriptor d, const RemoteSegment* previous, bool map_shm) const {
  auto segment = std::make_shared<RemoteSegment>();
  std::vector<RegionEntry> entries;
  entries.reserve(d.regions.size());
  for (const RegionDescriptor& r : d.regions) {
    RegionEntry entry{r.addr, r.length, nullptr, r.location, r.shm, nullptr, r.cuda};
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
        KVF_ASSIGN_OR_RETURN(mapping,
                             ShmMapping::open(d.pid, r.shm->fd, r.shm->file_bytes, r.shm->inode));
      }
      if (std::find(segment->mappings.begin(), segment->mappings.end(), mapping) ==
          segment->mappings.end()) {
        segment->mappings.push_back(mapping);
      }
      entry.host_ptr = mapping->base() + r.shm->file_offset;
    }
    entries.push_back(std::move(entry));
  }
  segment->regions = RegionIndex(std::move(entries));
  segment->descriptor = std::move(d);
  return std::shared_ptr<const RemoteSegment>(std::move(segment));
}

Status EngineImpl::refresh_peer(PeerState& peer) {
  std::lock_guard lock(peer.refresh_mu);
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(peer.name));
  KVF_ASSIGN_OR_RETURN(std::string json, store_->fetch(endpoint.to_string(),
                                                       Clock::now() + options_.handshake_timeout));
  KVF_ASSIGN_OR_RETURN(SegmentDescriptor d, parse_segment_descriptor(json));
  if (d.incarnation != peer.incarnation) {
    std::string why = fmt::format("restarted (incarnation {:016x} -> {:016x}); open it again",
                                  peer.incarnation, d.incarnation);
    peer.mark_disconnected(why);
    forget_incarnation(peer.incarnation);
    return PeerDisconnected("peer " + peer.name + " " + why);
  }
  auto previous = peer.segment.load();
  if (previous && d.version <= previous->descriptor.version) return Status::Ok();
  KVF_ASSIGN_OR_RETURN(auto segment, attach_segment(std::move(d), previous.get(),
                                                    peer.transport == TransportKind::kShm ||
                                                        peer.transport == TransportKind::kCudaIpc));
  peer.segment.store(std::move(segment));
  return Status::Ok();
}

}  // namespace kvferry::detail
