#include "engine/engine_impl.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <random>

#include "core/host_identity.h"
#include "core/logging.h"
#include "core/net.h"

namespace kvferry::detail {
namespace {

// Transports this build can serve. cuda_ipc is advertised whenever it is built; whether
// a device exists is found out when device memory is first registered or reached.
TransportSet built_transports() {
  TransportSet built{TransportKind::kLocal, TransportKind::kShm, TransportKind::kTcp};
  if (device_transport_built()) built.insert(TransportKind::kCudaIpc);
  return built;
}

uint64_t new_incarnation() {
  std::random_device rd;
  uint64_t id = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  id ^= static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  return id == 0 ? 1 : id;
}

}  // namespace

EngineImpl::EngineImpl(EngineOptions options)
    : options_(std::move(options)),
      incarnation_(new_incarnation()),
      workers_(options_.worker_threads),
      copier_(workers_, options_.inline_batch_bytes) {
  local_regions_.store(std::make_shared<const RegionIndex>());
}

EngineImpl::~EngineImpl() = default;

Result<std::unique_ptr<EngineImpl>> EngineImpl::create(EngineOptions options) {
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
  KVF_ASSIGN_OR_RETURN(Endpoint listen, parse_endpoint(options.listen_address, true));
  const TransportSet built = built_transports();
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
  std::unique_ptr<EngineImpl> engine(new EngineImpl(std::move(options)));
  engine->served_ = served;
  EngineImpl* raw = engine.get();
  KVF_ASSIGN_OR_RETURN(engine->handshake_,
                       HandshakeServer::start(
                           listen, [raw] { return *raw->descriptor_json_.load(); },
                           engine->options_.handshake_timeout));
  engine->endpoint_ = engine->handshake_->endpoint().to_string();
  engine->secret_ = engine->options_.secret;
  if (!engine->secret_) {
    if (const char* env = std::getenv("KVFERRY_SECRET"); env != nullptr && *env != '\0') {
      engine->secret_ = env;
    }
  }
  if (engine->secret_ && engine->secret_->empty()) {
    return InvalidArgument("secret is empty; leave it unset to turn authentication off");
  }
  if (served.contains(TransportKind::kTcp)) {
    TcpServerOptions tcp;
    if (engine->options_.tcp_listen_address.empty()) {
      tcp.listen = Endpoint{listen.host, 0};
    } else {
      KVF_ASSIGN_OR_RETURN(tcp.listen, parse_endpoint(engine->options_.tcp_listen_address, true));
    }
    tcp.io_threads = engine->options_.tcp_io_threads;
    tcp.incarnation = engine->incarnation_;
    tcp.secret = engine->secret_;
    if (engine->options_.tcp_lanes < 1 || engine->options_.tcp_lanes > 64) {
      return InvalidArgument(
          fmt::format("tcp_lanes {} out of range 1..64", engine->options_.tcp_lanes));
    }
    KVF_ASSIGN_OR_RETURN(engine->tcp_server_,
                         TcpServer::start(tcp, [raw] { return raw->local_regions_.load(); }));
    engine->tcp_endpoint_ = engine->tcp_server_->endpoint().to_string();
  }
  MetadataStoreOptions store_options;
  store_options.record_ttl = engine->options_.metadata_ttl;
  store_options.io_timeout = engine->options_.handshake_timeout;
  KVF_ASSIGN_OR_RETURN(engine->store_,
                       open_metadata_store(engine->options_.metadata_uri, store_options));
  engine->self_peer_ = std::make_shared<PeerState>(engine->endpoint_);
  engine->self_peer_->is_self = true;
  engine->self_peer_->transport = TransportKind::kLocal;
  engine->self_peer_->incarnation = engine->incarnation_;
  engine->self_peer_->pid = ::getpid();
  {
    std::lock_guard lock(engine->registry_mu_);
    // The first publish proves the store works; later failures are retried by its
    // keep-alive and logged.
    KVF_RETURN_IF_ERROR(engine->publish_locked());
  }
  log().info("engine '{}' listening on {} (incarnation {:016x})", engine->options_.name,
             engine->endpoint_, engine->incarnation_);
  return engine;
}

std::optional<ShmBacking> EngineImpl::shm_backing_locked(uint64_t addr, uint64_t length) const {
  auto it = shared_allocations_.upper_bound(addr);
  if (it == shared_allocations_.begin()) return std::nullopt;
  --it;
  const ShmAllocation& a = *it->second;
  uint64_t base = reinterpret_cast<uint64_t>(a.addr());
  if (addr < base || addr + length > base + a.bytes()) return std::nullopt;
  return ShmBacking{a.fd(), addr - base, a.bytes(), a.inode()};
}

Status EngineImpl::add_regions_locked(std::span<const MemoryRegion> regions) {
  auto current = local_regions_.load();
  std::vector<RegionEntry> entries(current->entries().begin(), current->entries().end());
  for (size_t i = 0; i < regions.size(); ++i) {
    const MemoryRegion& r = regions[i];
    auto addr = reinterpret_cast<uint64_t>(r.addr);
    if (r.addr == nullptr) return InvalidArgument(fmt::format("region {}: null address", i));
    if (r.length == 0) return InvalidArgument(fmt::format("region {} at {:#x}: length 0", i, addr));
    if (addr + r.length < addr) {
      return InvalidArgument(
          fmt::format("region {} at {:#x}: length {} wraps around", i, addr, r.length));
    }
    RegionEntry entry{addr,
                      r.length,
                      static_cast<char*>(r.addr),
                      r.location,
                      shm_backing_locked(addr, r.length),
                      std::make_shared<RegionUse>(),
                      std::nullopt};
    if (r.location.kind == MemoryLocation::Kind::kCuda) {
      Result<DeviceTransport*> device = device_transport();
      if (!device.ok()) {
        return Status(device.status().code(),
                      fmt::format("region {} at {:#x}: cuda:{} memory: {}", i, addr,
                                  r.location.device, device.status().message()));
      }
      Result<CudaIpcBacking> exported = (*device)->export_region(r.addr, r.length, r.location);
      if (!exported.ok()) {
        return Status(exported.status().code(),
                      fmt::format("region {}: {}", i, exported.status().message()));
      }
      entry.cuda = *exported;
    }
    // Overlap against everything registered so far, including earlier entries of this call.
    for (const RegionEntry& e : entries) {
      if (addr < e.end() && e.addr < addr + r.length) {
        return AlreadyExists(
            fmt::format("region {} [{:#x}, +{}) overlaps registered region [{:#x}, +{})", i, addr,
                        r.length, e.addr, e.length));
      }
    }
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(),
            [](const RegionEntry& a, const RegionEntry& b) { return a.addr < b.addr; });
  local_regions_.store(std::make_shared<const RegionIndex>(std::move(entries)));
  publish_locked().ignore();
  return Status::Ok();
}

Status EngineImpl::publish_locked() {
  SegmentDescriptor d;
  d.name = options_.name;
  d.endpoint = endpoint_;
  d.tcp_endpoint = tcp_endpoint_;
  d.incarnation = incarnation_;
  d.host_id = host_identity();
  d.pid = ::getpid();
  d.transports = served_;
  d.version = ++descriptor_version_;
  for (const RegionEntry& e : local_regions_.load()->entries()) {
    d.regions.push_back(RegionDescriptor{e.addr, e.length, e.location, e.shm, e.cuda});
  }
  auto json = std::make_shared<const std::string>(serialize_segment_descriptor(d));
  descriptor_json_.store(json);
  if (!store_) return Status::Ok();
  Status published = store_->publish(endpoint_, *json);
  if (!published.ok()) {
    log().warn("publishing to {} failed (its keep-alive retries): {}", store_->uri(),
               published.to_string());
  }
  return published;
}

Result<DeviceTransport*> EngineImpl::device_transport() const {
  std::call_once(device_once_, [this] {
    Result<std::unique_ptr<DeviceTransport>> opened = open_device_transport();
    if (opened.ok()) {
      device_ = std::move(*opened);
      device_ready_.store(device_.get());
    } else {
      device_error_ = opened.status();
      log().info("device memory unavailable: {}", device_error_.message());
    }
  });
  if (device_) return device_.get();
  return device_error_;
}

void EngineImpl::forget_incarnation(uint64_t incarnation) {
  // Only a transport already open can hold anything of the peer: never open one here.
  if (DeviceTransport* device = device_ready_.load()) device->forget_peer(incarnation);
}

Status EngineImpl::register_memory(std::span<const MemoryRegion> regions) {
  if (regions.empty()) return InvalidArgument("register_memory: no regions given");
  std::lock_guard lock(registry_mu_);
  return add_regions_locked(regions);
}

Status EngineImpl::unregister_memory(std::span<void* const> addrs) {
  if (addrs.empty()) return InvalidArgument("unregister_memory: no addresses given");
  std::lock_guard lock(registry_mu_);
  return unregister_locked(addrs);
}

Status EngineImpl::unregister_locked(std::span<void* const> addrs) {
  auto current = local_regions_.load();
  std::vector<const RegionEntry*> victims;
  for (void* p : addrs) {
    auto addr = reinterpret_cast<uint64_t>(p);
    const RegionEntry* e = current->find_start(addr);
    if (e == nullptr)
      return NotRegistered(fmt::format("no registered region starts at {:#x}", addr));
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
  std::vector<RegionEntry> kept;
  for (const RegionEntry& e : current->entries()) {
    if (std::find(victims.begin(), victims.end(), &e) == victims.end()) kept.push_back(e);
  }
  local_regions_.store(std::make_shared<const RegionIndex>(std::move(kept)));
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
