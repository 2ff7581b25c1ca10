#include "engine/engine_impl.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>
#include <utility>
#include <vector>

#include "core/auth.h"
#include "core/fd_limit.h"
#include "core/host_identity.h"
#include "core/logging.h"
#include "core/net.h"
#include "core/own_memory.h"
#include "metadata/segment_descriptor.h"

namespace kvferry::detail {
namespace {

uint64_t new_incarnation() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  id ^= static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return id == 0 ? 1 : id;
}

// AlreadyExists naming region `index` of the caller's batch and the range it overlaps.
Status overlap_error(size_t index, const MemoryRegion& r, std::string_view what_it_overlaps) {
  return AlreadyExists(fmt::format("region {} [{:#x}, +{}) overlaps {}", index,
                                   reinterpret_cast<uint64_t>(r.addr), r.length, what_it_overlaps));
}

// AlreadyExists when two of `regions` overlap or one overlaps a region of `registered`.
// O(n log n + n log m): a sort, a pass over neighbours, and a binary search of the registered
// regions per region. Where several overlaps exist, the one named is the first in the
// caller's order against registered regions, or else the first pair in address order (naming
// the later of the two in the caller's order).
Status check_no_overlap(std::span<const MemoryRegion> regions, const RegionIndex& registered) {
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemoryRegion& r = regions[i];
    if (const RegionEntry* e =
            registered.find_overlap(reinterpret_cast<uint64_t>(r.addr), r.length)) {
      return overlap_error(i, r, fmt::format("registered region [{:#x}, +{})", e->addr, e->length));
    }
  }
  std::vector<std::pair<uint64_t, size_t>> starts;  // (address, index in the caller's batch)
  starts.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    starts.emplace_back(reinterpret_cast<uint64_t>(regions[i].addr), i);
  }
  std::sort(starts.begin(), starts.end());
  // Sorted by start, the regions are disjoint when each ends at or before the next starts.
  for (size_t k = 1; k < starts.size(); ++k) {
    const size_t before = starts[k - 1].second;
    const size_t after = starts[k].second;
    if (starts[k].first - starts[k - 1].first >= regions[before].length) continue;
    const size_t named = std::max(before, after);
    const size_t other = std::min(before, after);
    return overlap_error(
        named, regions[named],
        fmt::format("region {} [{:#x}, +{}) of the same batch", other,
                    reinterpret_cast<uint64_t>(regions[other].addr), regions[other].length));
  }
  return Status::Ok();
}

// The "host:port"s peers may dial to reach a listener bound to `bound`: a listener on every
// interface is reached at each interface address (loopback only where there is no other).
std::vector<std::string> advertised_endpoints(const Endpoint& bound) {
  if (!is_any_address(bound.host)) return {bound.to_string()};
  std::vector<std::string> hosts = interface_addresses();
  if (hosts.empty()) hosts.emplace_back("127.0.0.1");
  std::vector<std::string> out;
  out.reserve(hosts.size());
  for (const std::string& host : hosts) out.push_back(Endpoint{host, bound.port}.to_string());
  return out;
}

}  // namespace

EngineImpl::EngineImpl(EngineOptions options)
    : options_(std::move(options)),
      incarnation_(new_incarnation()),
      metrics_(options_.metrics ? std::make_unique<EngineMetrics>() : nullptr),
      workers_(options_.worker_threads, "kvf-copy", ThreadPool::Start::kOnDemand) {
  local_regions_.store(std::make_shared<const RegionIndex>());
}

EngineImpl::~EngineImpl() {
  // Notifications already queued are still delivered, every peer's at once (each sender
  // drains for NotificationSender::kDrain), before the senders are joined one by one.
  std::lock_guard lock(notify_mu_);
  for (auto& [name, sender] : notify_senders_) {
    sender->shutdown(Cancelled("the sending engine shut down"), NotificationSender::kDrain);
  }
}

Result<std::unique_ptr<EngineImpl>> EngineImpl::create(EngineOptions options) {
  return create(std::move(options), built_transports());
}

Result<std::unique_ptr<TransferEngine>> EngineImpl::create_engine(
    EngineOptions options, const std::vector<BuiltTransport>& transports) {
  KVF_ASSIGN_OR_RETURN(auto impl, create(std::move(options), transports));
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

Result<std::unique_ptr<EngineImpl>> EngineImpl::create(
    EngineOptions options, const std::vector<BuiltTransport>& transports) {
  if (options.worker_threads < 0 || options.worker_threads > 256) {
    return InvalidArgument(
        fmt::format("worker_threads {} out of range 0..256", options.worker_threads));
  }
  if (options.batch_timeout.count() <= 0 || options.batch_timeout > kMaxBatchTimeout) {
    return InvalidArgument(fmt::format("batch_timeout {} ms out of range 1..{} ms",
                                       options.batch_timeout.count(), kMaxBatchTimeout.count()));
  }
  if (options.handshake_timeout.count() <= 0) {
    return InvalidArgument(
        fmt::format("handshake_timeout {} ms must be positive", options.handshake_timeout.count()));
  }
  if (options.max_notification_bytes == 0 ||
      options.max_notification_bytes > kMaxNotificationBytesLimit) {
    return InvalidArgument(fmt::format("max_notification_bytes {} out of range 1..{}",
                                       options.max_notification_bytes, kMaxNotificationBytesLimit));
  }
  if (options.max_pending_notifications == 0) {
    return InvalidArgument("max_pending_notifications 0 must be positive");
  }
  if (options.max_pending_notification_bytes < options.max_notification_bytes) {
    return InvalidArgument(
        fmt::format("max_pending_notification_bytes {} is less than max_notification_bytes {}",
                    options.max_pending_notification_bytes, options.max_notification_bytes));
  }
  KVF_ASSIGN_OR_RETURN(Endpoint listen, parse_endpoint(options.listen_address, true));
  TransportSet built;
  for (const BuiltTransport& t : transports) built.insert(t.kind);
  TransportSet served =
      options.allowed_transports.empty() ? built : options.allowed_transports.intersect(built);
  for (TransportKind kind : kAllTransportKinds) {
    if (options.allowed_transports.contains(kind) && !built.contains(kind)) {
      return NotSupported(fmt::format("allowed transport {} is not built into this engine",
                                      transport_kind_name(kind)));
    }
  }
  if (options.forced_transport && !served.contains(*options.forced_transport)) {
    return InvalidArgument(fmt::format("forced transport {} is not among the served ones",
                                       transport_kind_name(*options.forced_transport)));
  }
  KVF_ASSIGN_OR_RETURN(std::optional<std::string> secret, resolve_secret(options.secret));
  static std::once_flag open_files_raised;
  std::call_once(open_files_raised, [] {
    if (std::optional<OpenFilesLimitChange> change = raise_open_files_limit()) {
      log().info(
          "raised this process's open-files limit from {} to {} (an engine holds about "
          "four descriptors per tcp peer)",
          change->from, change->to);
    }
  });
  std::unique_ptr<EngineImpl> engine(new EngineImpl(std::move(options)));
  engine->served_ = served;
  engine->secret_ = std::move(secret);
  EngineImpl* raw = engine.get();
  // With a secret, the descriptor (addresses, pid, memfds) is served only to peers that
  // prove it.
  KVF_ASSIGN_OR_RETURN(engine->handshake_,
                       HandshakeServer::start(
                           listen, [raw] { return raw->descriptor_json_.load(); },
                           engine->options_.handshake_limits, engine->secret_));
  engine->endpoints_ = advertised_endpoints(engine->handshake_->endpoint());
  engine->endpoint_ = engine->endpoints_.front();
  if (!is_loopback_host(listen.host) && !engine->secret_) {
    static std::once_flag warned;
    std::call_once(warned, [&] {
      log().warn(
          "engine '{}' listens on {} without a secret: any host that reaches it can read its "
          "descriptor (the addresses of its registered memory) and read and write that memory "
          "over tcp; set EngineOptions::secret or KVFERRY_SECRET on every engine of the "
          "deployment",
          engine->options_.name, listen.host);
    });
  }
  if (served.contains(TransportKind::kShm)) {
    KVF_ASSIGN_OR_RETURN(
        engine->shm_fd_server_,
        ShmFdServer::start(
            engine->incarnation_, [raw](uint64_t inode) { return raw->dup_shared_fd(inode); },
            engine->secret_, engine->options_.handshake_timeout));
  }
  NotificationReceiver::Options notify;
  notify.listen = Endpoint{listen.host, 0};
  notify.incarnation = engine->incarnation_;
  notify.secret = engine->secret_;
  notify.max_notification_bytes = static_cast<uint32_t>(engine->options_.max_notification_bytes);
  notify.max_pending = engine->options_.max_pending_notifications;
  notify.max_pending_bytes = engine->options_.max_pending_notification_bytes;
  notify.io_timeout = engine->options_.handshake_timeout;
  notify.metrics = engine->metrics_.get();
  KVF_ASSIGN_OR_RETURN(engine->notifications_, NotificationReceiver::start(std::move(notify)));
  TransportEnv env;
  env.engine_name = engine->options_.name;
  env.listen_host = listen.host;
  env.tcp_listen_address = engine->options_.tcp_listen_address;
  env.tcp_lanes = engine->options_.tcp_lanes;
  env.tcp_io_threads = engine->options_.tcp_io_threads;
  env.tcp_staging_buffer_bytes = engine->options_.tcp_staging_buffer_bytes;
  env.tcp_staging_buffers = engine->options_.tcp_staging_buffers;
  env.open_cuda_api = built_cuda_memory_api_opener();
  env.connect_timeout = engine->options_.handshake_timeout;
  env.secret = engine->secret_;
  env.tcp_limits = engine->options_.tcp_limits;
  env.tcp_max_queued_replies = engine->options_.tcp_max_queued_replies;
  env.tcp_stall_timeout = engine->options_.tcp_stall_timeout;
  env.frame_rest_timeout = engine->options_.frame_rest_timeout;
  env.ucx_allow_emulated = engine->options_.ucx_allow_emulated;
  if (const char* allow = std::getenv("KVFERRY_UCX_ALLOW_EMULATED");
      allow != nullptr && std::string_view(allow) == "1") {
    env.ucx_allow_emulated = true;
  }
  env.incarnation = engine->incarnation_;
  env.inline_batch_bytes = engine->options_.inline_batch_bytes;
  env.workers = &engine->workers_;
  env.local_regions = [raw] { return raw->local_regions_.load(); };
  for (const BuiltTransport& t : transports) {
    if (!served.contains(t.kind)) continue;
    KVF_ASSIGN_OR_RETURN(engine->transports_[static_cast<size_t>(t.kind)], t.create(env));
  }
  MetadataStoreOptions store_options;
  store_options.record_ttl = engine->options_.metadata_ttl;
  store_options.io_timeout = engine->options_.handshake_timeout;
  store_options.secret = engine->secret_;
  KVF_ASSIGN_OR_RETURN(engine->store_,
                       open_metadata_store(engine->options_.metadata_uri, store_options));
  auto self = std::make_shared<PeerState>(engine->endpoint_);
  self->is_self = true;
  self->place = PeerPlace::kSelf;
  self->incarnation = engine->incarnation_;
  self->pid = ::getpid();
  {
    std::lock_guard lock(engine->registry_mu_);
    // The first publish proves the store works; later failures are retried by its
    // keep-alive and logged.
    KVF_RETURN_IF_ERROR(engine->publish_locked());
    SegmentDescriptor own = *parse_segment_descriptor(*engine->descriptor_json_.load());
    reach_through(own, parse_endpoint(engine->endpoint_)->host);
    engine->connect_links(*self, own);
  }
  engine->self_peer_ = std::move(self);
  log().info("engine '{}' listening on {} (incarnation {:016x})", engine->options_.name,
             fmt::join(engine->endpoints_, ", "), engine->incarnation_);
  return engine;
}

Fd EngineImpl::dup_shared_fd(uint64_t inode) const {
  std::lock_guard lock(registry_mu_);
  for (const auto& [addr, allocation] : shared_allocations_) {
    if (allocation->inode() == inode) return Fd(::fcntl(allocation->fd(), F_DUPFD_CLOEXEC, 0));
  }
  return Fd();
}

ShmAllocation* EngineImpl::shm_allocation_locked(uint64_t addr, uint64_t length) const {
  auto it = shared_allocations_.upper_bound(addr);
  if (it == shared_allocations_.begin()) return nullptr;
  --it;
  ShmAllocation& a = *it->second;
  uint64_t base = reinterpret_cast<uint64_t>(a.addr());
  if (addr < base || addr + length > base + a.bytes()) return nullptr;
  return &a;
}

Result<std::optional<ShmBacking>> EngineImpl::claim_shm_backing_locked(uint64_t addr,
                                                                       uint64_t length) {
  ShmAllocation* a = shm_allocation_locked(addr, length);
  if (a == nullptr) return std::optional<ShmBacking>();
  KVF_ASSIGN_OR_RETURN(ShmAllocation::GuardClaim claim, a->claim_guard());
  const uint64_t base = reinterpret_cast<uint64_t>(a->addr());
  return std::optional<ShmBacking>(ShmBacking{a->fd(), addr - base, a->file_bytes(), a->inode(),
                                              a->guard_offset(), claim.slot, claim.generation});
}

void EngineImpl::release_shm_backings_locked(std::span<const RegionEntry> entries) {
  for (const RegionEntry& e : entries) {
    if (!e.shm) continue;
    if (ShmAllocation* a = shm_allocation_locked(e.addr, e.length)) {
      a->release_guard(e.shm->guard_slot);
    }
  }
}

Status EngineImpl::check_regions(std::span<const MemoryRegion> regions) {
  // Read once per call (not per region): a batch of many regions costs one read of
  // /proc/self/maps.
  std::optional<MemoryMap> mapped;
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemoryRegion& r = regions[i];
    auto addr = reinterpret_cast<uint64_t>(r.addr);
    if (r.addr == nullptr) return InvalidArgument(fmt::format("region {}: null address", i));
    if (r.length == 0) return InvalidArgument(fmt::format("region {} at {:#x}: length 0", i, addr));
    if (addr + r.length < addr) {
      return InvalidArgument(
          fmt::format("region {} at {:#x}: length {} wraps around", i, addr, r.length));
    }
    // Device memory is checked by the transports that prepare it (prepare_device_region).
    if (r.location.kind == MemoryLocation::Kind::kCuda) continue;
    if (!mapped) mapped = MemoryMap::of_this_process();
    if (!mapped->readable(addr, r.length)) {
      return InvalidArgument(
          fmt::format("region {} [{:#x}, +{}) is not mapped in this process (every byte must be "
                      "mapped readable)",
                      i, addr, r.length));
    }
  }
  return Status::Ok();
}

Status EngineImpl::add_regions_locked(std::span<const MemoryRegion> regions) {
  // Every region is checked (mapped, no overlap) before any is handed to a transport, so a
  // refusal here leaves nothing to roll back.
  KVF_RETURN_IF_ERROR(check_regions(regions));
  auto current = local_regions_.load();
  if (current->entries().size() + regions.size() > kMaxDescriptorRegions) {
    return InvalidArgument(fmt::format(
        "registering {} regions beside the {} registered would advertise more than a peer "
        "accepts ({}): register fewer, larger regions",
        regions.size(), current->entries().size(), kMaxDescriptorRegions));
  }
  KVF_RETURN_IF_ERROR(check_no_overlap(regions, *current));
  // The new snapshot: what is registered, then this call's regions built in place behind it
  // (an entry is a few hundred bytes: each copy of 100,000 is felt), in the caller's order
  // so an error names the region the caller would expect; sorted by address after.
  const std::span<const RegionEntry> existing = current->entries();
  RegionEntries entries;
  entries.reserve(existing.size() + regions.size());
  entries.assign(existing.begin(), existing.end());
  const auto first_added = static_cast<ptrdiff_t>(existing.size());
  auto added = [&] { return std::span<const RegionEntry>(entries).subspan(existing.size()); };
  auto roll_back = [&] {
    unregister_regions(added());
    release_shm_backings_locked(added());
  };
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemoryRegion& r = regions[i];
    auto addr = reinterpret_cast<uint64_t>(r.addr);
    Result<std::optional<ShmBacking>> backing = claim_shm_backing_locked(addr, r.length);
    if (!backing.ok()) {
      roll_back();
      return Status(backing.status().code(),
                    fmt::format("region {} at {:#x}: {}", i, addr, backing.status().message()));
    }
    RegionEntry& entry = entries.emplace_back();
    entry.addr = addr;
    entry.length = r.length;
    entry.host_ptr = static_cast<char*>(r.addr);
    entry.location = r.location;
    entry.shm = *backing;
    entry.use = std::make_shared<RegionUse>();
    Status prepared = Status::Ok();
    if (r.location.kind == MemoryLocation::Kind::kCuda) {
      prepared = prepare_device_region(entry, i);
    }
    if (prepared.ok()) prepared = register_region_everywhere(entry, i);
    if (!prepared.ok()) {
      RegionEntry failed = std::move(entries.back());
      entries.pop_back();
      roll_back();
      release_shm_backings_locked({&failed, 1});
      return prepared;
    }
  }
  // Regions are disjoint, so their start addresses order them. Registration in address
  // order, above what is registered, needs neither step.
  auto by_addr = [](const RegionEntry& a, const RegionEntry& b) { return a.addr < b.addr; };
  const auto middle = entries.begin() + first_added;
  if (!std::is_sorted(middle, entries.end(), by_addr)) std::sort(middle, entries.end(), by_addr);
  if (middle != entries.begin() && middle != entries.end() && by_addr(*middle, *(middle - 1))) {
    std::inplace_merge(entries.begin(), middle, entries.end(), by_addr);
  }
  local_regions_.store(std::make_shared<const RegionIndex>(std::move(entries)));
  publish_locked().ignore();
  return Status::Ok();
}

Status EngineImpl::publish_locked() {
  SegmentDescriptor d;
  d.name = options_.name;
  d.endpoint = endpoint_;
  d.incarnation = incarnation_;
  d.host_id = host_identity();
  d.pid = ::getpid();
  d.transports = served_;
  d.version = ++descriptor_version_;
  if (shm_fd_server_) d.shm_socket = shm_fd_server_->name();
  if (notifications_) d.notify_endpoint = notifications_->endpoint().to_string();
  for (const auto& t : transports_) {
    if (t) t->describe(d);
  }
  // Each region through one scratch descriptor: no copy of them all. A host region takes
  // about 50 bytes of text.
  const auto snapshot = local_regions_.load();
  const std::span<const RegionEntry> entries = snapshot->entries();
  std::string regions;
  regions.reserve(64 * entries.size() + 2);
  regions.push_back('[');
  RegionDescriptor scratch;
  for (const RegionEntry& e : entries) {
    if (regions.size() != 1) regions.push_back(',');
    scratch.addr = e.addr;
    scratch.length = e.length;
    scratch.location = e.location;
    scratch.shm = e.shm;
    scratch.cuda = e.cuda;
    scratch.ucx_rkey = e.ucx_rkey;
    append_region_json(regions, scratch);
  }
  regions.push_back(']');
  auto json = std::make_shared<const std::string>(serialize_segment_descriptor(d, regions));
  descriptor_json_.store(json);
  if (!store_) return Status::Ok();
  Status published = store_->publish(endpoint_, *json);
  if (!published.ok()) {
    log().warn("publishing to {} failed (its keep-alive retries): {}", store_->uri(),
               published.to_string());
  }
  return published;
}

Status EngineImpl::prepare_device_region(RegionEntry& entry, size_t index) {
  // Device memory exists only where a transport that reaches it says so.
  Status outcome = NotSupported(
      "no transport of this engine reaches device memory (cuda_ipc is not served, or this build "
      "has no CUDA support: configure with the CUDA toolkit and KVFERRY_CUDA=ON)");
  // Every transport that reaches device memory prepares it (cuda_ipc exports its handle,
  // tcp checks it can stage it); the region is registered when at least one accepts.
  bool accepted = false;
  for (const auto& t : transports_) {
    if (!t || !t->capabilities().reaches_local_device) continue;
    Status s = t->prepare_region(entry);
    if (s.ok()) {
      accepted = true;
    } else if (!accepted) {
      outcome = s;
    }
  }
  if (accepted) return Status::Ok();
  return Status(outcome.code(), fmt::format("region {} at {:#x}: cuda:{} memory: {}", index,
                                            entry.addr, entry.location.device, outcome.message()));
}

Status EngineImpl::register_region_everywhere(RegionEntry& entry, size_t index) {
  for (size_t k = 0; k < transports_.size(); ++k) {
    if (!transports_[k]) continue;
    Status s = transports_[k]->register_region(entry);
    if (s.ok()) continue;
    for (size_t j = 0; j < k; ++j) {
      if (transports_[j]) transports_[j]->unregister_region(entry);
    }
    return Status(s.code(), fmt::format("region {} at {:#x}: {}: {}", index, entry.addr,
                                        transport_kind_name(transports_[k]->kind()), s.message()));
  }
  return Status::Ok();
}

void EngineImpl::unregister_regions(std::span<const RegionEntry> entries) {
  if (entries.empty()) return;
  for (const auto& t : transports_) {
    if (t) t->unregister_regions(entries);
  }
}

void EngineImpl::forget_incarnation(uint64_t incarnation) {
  for (const auto& t : transports_) {
    if (t) t->forget_peer(incarnation);
  }
}

Status EngineImpl::register_memory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgument("register_memory: no regions given");
  std::lock_guard lock(registry_mu_);
  return add_regions_locked(regions);
}

Result<MemoryLocation> EngineImpl::registered_location(uint64_t addr, uint64_t length) const {
  size_t hint = 0;
  const RegionEntry* r = local_regions_.load()->find(addr, length, hint);
  if (r == nullptr) {
    return NotRegistered(
        fmt::format("[{:#x}, +{}) is not inside one registered region", addr, length));
  }
  return r->location;
}

Status EngineImpl::unregister_memory(std::span<void* const> addrs) {
  if (addrs.empty()) return InvalidArgument("unregister_memory: no addresses given");
  std::lock_guard lock(registry_mu_);
  return unregister_locked(addrs);
}

Status EngineImpl::unregister_locked(std::span<void* const> addrs) {
  auto current = local_regions_.load();
  const std::span<const RegionEntry> entries = current->entries();
  // Marked by position in the sorted snapshot: O(log n) per address, one pass to split. An
  // address given twice names the same region, which goes once.
  std::vector<bool> is_victim(entries.size(), false);
  std::vector<const RegionEntry*> victims;
  victims.reserve(addrs.size());
  for (void* p : addrs) {
    auto addr = reinterpret_cast<uint64_t>(p);
    const RegionEntry* e = current->find_start(addr);
    if (e == nullptr)
      return NotRegistered(fmt::format("no registered region starts at {:#x}", addr));
    const auto at = static_cast<size_t>(e - entries.data());
    if (is_victim[at]) continue;
    is_victim[at] = true;
    victims.push_back(e);
  }
  // Claim every victim, then check for batches in flight (see RegionUse).
  for (const RegionEntry* e : victims) e->use->removed.store(true);
  for (const RegionEntry* e : victims) {
    if (int64_t n = e->use->in_flight.load(); n > 0) {
      for (const RegionEntry* v : victims) v->use->removed.store(false);
      return FailedPrecondition(
          fmt::format("region [{:#x}, +{}) is used by {} batch(es) in flight; wait for them first",
                      e->addr, e->length, n));
    }
  }
  RegionEntries kept;
  RegionEntries gone;
  kept.reserve(entries.size() - victims.size());
  gone.reserve(victims.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    (is_victim[i] ? gone : kept).push_back(entries[i]);
  }
  local_regions_.store(std::make_shared<const RegionIndex>(std::move(kept)));
  unregister_regions(gone);
  // Same-host peers that mapped them see the guard words change: their later ops fail.
  release_shm_backings_locked(gone);
  publish_locked().ignore();
  return Status::Ok();
}

Result<SharedBuffer> EngineImpl::allocate_shared(size_t bytes) {
  KVF_ASSIGN_OR_RETURN(auto allocation, ShmAllocation::create(options_.name, bytes));
  std::lock_guard lock(registry_mu_);
  auto addr = reinterpret_cast<uint64_t>(allocation->addr());
  SharedBuffer buffer{allocation->addr(), allocation->bytes()};
  shared_allocations_.emplace(addr, std::move(allocation));
  MemoryRegion region{buffer.addr, buffer.length, {}};
  if (Status s = add_regions_locked({&region, 1}); !s.ok()) {
    shared_allocations_.erase(addr);
    return s;
  }
  return buffer;
}

Status EngineImpl::free_shared(void* addr) {
  auto key = reinterpret_cast<uint64_t>(addr);
  // One hold of the lock: nothing can be registered inside the allocation between its
  // region going and the memory being unmapped.
  std::lock_guard lock(registry_mu_);
  auto it = shared_allocations_.find(key);
  if (it == shared_allocations_.end()) {
    return NotRegistered(fmt::format("{:#x} is not the start of a shared allocation", key));
  }
  if (local_regions_.load()->find_start(key) != nullptr) {  // the user may have unregistered it
    void* addrs[] = {addr};
    KVF_RETURN_IF_ERROR(unregister_locked(addrs));
  }
  shared_allocations_.erase(it);
  return Status::Ok();
}

}  // namespace kvferry::detail
