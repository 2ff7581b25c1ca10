// EngineImpl: the TransferEngine behind its public facade (include/kvferry/transfer_engine.h
// states the contract and thread-safety). Split by concern:
//   engine_impl.cc        creation, registration, shared allocations, descriptor publishing
//   engine_peers.cc       open_peer, descriptor refresh, links and routes
//   engine_batches.cc     submit, status, wait, cancel
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "core/shared_snapshot.h"
#include "core/thread_pool.h"
#include "engine/batch_record.h"
#include "engine/notify_receiver.h"
#include "engine/notify_sender.h"
#include "engine/peer_monitor.h"
#include "engine/peer_state.h"
#include "engine/span_recycler.h"
#include "kvferry/transfer_engine.h"
#include "metadata/handshake.h"
#include "metadata/metadata_store.h"
#include "transport/built_transports.h"
#include "transport/region_index.h"
#include "transport/shm_fd_server.h"
#include "transport/shm_mapping.h"
#include "transport/transport.h"

namespace kvferry::detail {

// A descriptor's listeners on every interface (tcp, notifications) become `host`: the host
// its owner was reached at.
void reach_through(SegmentDescriptor& d, std::string_view host);

class EngineImpl {
 public:
  static Result<std::unique_ptr<EngineImpl>> create(EngineOptions options);
  // An engine built from these transports instead of the build's (a test seam: a test adds
  // a transport of its own without touching the engine).
  static Result<std::unique_ptr<TransferEngine>> create_engine(
      EngineOptions options, const std::vector<BuiltTransport>& transports);
  ~EngineImpl();

  const std::string& endpoint() const { return endpoint_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  const EngineOptions& options() const { return options_; }
  uint64_t incarnation() const { return incarnation_; }
  const std::optional<std::string>& secret() const { return secret_; }

  Status register_memory(std::span<const MemoryRegion> regions);
  Status unregister_memory(std::span<void* const> addrs);
  Result<MemoryLocation> registered_location(uint64_t addr, uint64_t length) const;
  Result<SharedBuffer> allocate_shared(size_t bytes);
  Status free_shared(void* addr);

  Result<PeerHandle> open_peer(std::string_view name, const PeerOptions& options);

  void close_peer(const PeerHandle& peer);
  Status probe_peer(std::string_view name, std::chrono::milliseconds timeout);

  Result<BatchHandle> submit(const PeerHandle& peer, std::span<const TransferOp> ops,
                             const SubmitOptions& options);
  BatchStatus status(const BatchHandle& batch) const;
  BatchStatus wait(const BatchHandle& batch, std::chrono::milliseconds timeout) const;
  void cancel(const BatchHandle& batch);
  Status send_notification(const PeerHandle& peer, std::string_view bytes,
                           std::chrono::milliseconds timeout);
  std::vector<Notification> get_notifications(size_t max);
  // Empty when EngineOptions::metrics is off.
  MetricsSnapshot metrics();

  static const PeerState& peer_state(const PeerHandle& h) { return *h.state_; }
  static TransportKind preferred_transport(const PeerHandle& h);
  static std::vector<Route> routes(const PeerHandle& h);

 private:
  static Result<std::unique_ptr<EngineImpl>> create(EngineOptions options,
                                                    const std::vector<BuiltTransport>& transports);
  explicit EngineImpl(EngineOptions options);
  Transport* transport(TransportKind kind) const {
    return transports_[static_cast<size_t>(kind)].get();
  }

  // A duplicate of the memfd of the shared allocation with this inode (invalid: none), for
  // the shm fd server. Takes registry_mu_.
  Fd dup_shared_fd(uint64_t inode) const;
  // InvalidArgument naming the first region that is null, empty, wraps around the address
  // space, or (host memory) is not mapped readable in this process.
  static Status check_regions(std::span<const MemoryRegion> regions);
  // Registration helpers; registry_mu_ held.
  Status add_regions_locked(std::span<const MemoryRegion> regions);
  Status unregister_locked(std::span<void* const> addrs);
  // Rebuilds the descriptor and publishes it; the error is the store's.
  Status publish_locked();
  // The shared allocation that holds all of [addr, addr + length), or null.
  ShmAllocation* shm_allocation_locked(uint64_t addr, uint64_t length) const;
  // The shm backing of a range being registered, with a guard slot claimed for it (none
  // when the range is not inside a shared allocation).
  Result<std::optional<ShmBacking>> claim_shm_backing_locked(uint64_t addr, uint64_t length);
  // Releases the guard slots of registrations that are gone (or never completed).
  void release_shm_backings_locked(std::span<const RegionEntry> entries);
  // Asks the transports that reach device memory to prepare a device region (cuda_ipc
  // exports its IPC handle); the error names region `index`.
  Status prepare_device_region(RegionEntry& entry, size_t index);
  // Transport::register_region for every served transport; on an error, the ones that had
  // registered it unregister it again.
  Status register_region_everywhere(RegionEntry& entry, size_t index);
  void unregister_regions(std::span<const RegionEntry> entries);

  // Peers.
  // The descriptor of the peer whose handshake endpoint is `peer`, its listeners on every
  // interface made reachable through the host it was fetched from (reach_through).
  Result<SegmentDescriptor> fetch_descriptor(const Endpoint& peer,
                                             Clock::time_point deadline) const;
  Result<std::shared_ptr<PeerState>> connect_peer(const std::string& name,
                                                  const PeerOptions& options);
  // The peer's links (one per transport both serve) and its route chooser; no shm link when
  // peer.shm_refused says why not.
  void connect_links(PeerState& peer, const SegmentDescriptor& d);
  // Builds the reachable view of a peer's regions; `map_shm` maps their memfds.
  Result<std::shared_ptr<const RemoteSegment>> attach_segment(SegmentDescriptor d,
                                                              const RemoteSegment* previous,
                                                              bool map_shm) const;
  // Whether a link of the peer needs its shareable host memory mapped here (and may).
  bool maps_remote_host_memory(const PeerState& peer) const;
  // Fetches the peer's descriptor again (bounded by the batch's deadline too).
  Status refresh_peer(PeerState& peer, Clock::time_point batch_deadline);
  // Drops what was opened for a peer incarnation that is gone (its IPC handles).
  void forget_incarnation(uint64_t incarnation);

  // Notifications: the sender to the peer's current incarnation (made on first need), or
  // NotSupported when the peer takes none; checks `bytes` against the size limit.
  Result<std::shared_ptr<NotificationSender>> notification_sender(PeerState& peer, size_t bytes);
  void drop_notification_sender(const std::string& peer_name, const Status& why);

  // Batches.
  static void enforce_deadline(BatchRecord& b);
  // A data-complete batch with a notification is complete once the notification is.
  static BatchStatus with_notification(const BatchRecord& b, BatchStatus s);
  // Posts every part of the resolved batch; on an error, stops the batch with it.
  Status post_parts(const std::shared_ptr<BatchProgress>& batch, PeerState& peer,
                    void* after_cuda_event);

  EngineOptions options_;
  uint64_t incarnation_ = 0;
  std::string endpoint_;  // endpoints_.front()
  std::vector<std::string> endpoints_;
  TransportSet served_;
  std::optional<std::string> secret_;
  // EngineOptions::metrics: the counters, or null (no hook runs). Declared before the
  // workers and transports, so it outlives every thread that finishes a batch.
  std::unique_ptr<EngineMetrics> metrics_;

  // Registration. Writers serialise on registry_mu_; readers load the snapshot.
  mutable std::mutex registry_mu_;
  SharedSnapshot<RegionIndex> local_regions_;
  // Span storage of large batches, reused (shared: a batch may outlive the engine).
  const std::shared_ptr<SpanRecycler> span_recycler_ = std::make_shared<SpanRecycler>();
  std::map<uint64_t, std::unique_ptr<ShmAllocation>> shared_allocations_;  // by address
  uint64_t descriptor_version_ = 0;
  SharedSnapshot<std::string> descriptor_json_;

  // Peers by the name they were opened with.
  std::mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<PeerState>> peers_;
  std::shared_ptr<PeerState> self_peer_;

  // Declared last: destroyed first, so no thread touches the state above after it dies.
  ThreadPool workers_;
  PeerMonitor monitor_;
  // By TransportKind; null where not served. Destroyed after the peers and batches that
  // use them are gone (handles must not outlive the engine).
  std::array<std::unique_ptr<Transport>, kAllTransportKinds.size()> transports_;
  // Notifications: the receiver, and a sender per peer name (to its current incarnation).
  std::unique_ptr<NotificationReceiver> notifications_;
  std::mutex notify_mu_;
  std::unordered_map<std::string, std::shared_ptr<NotificationSender>> notify_senders_;
  std::unique_ptr<HandshakeServer> handshake_;
  // Hands this engine's memfds to authorised same-host peers; declared after
  // shared_allocations_, so it stops (and its threads stop looking them up) first.
  std::unique_ptr<ShmFdServer> shm_fd_server_;
  std::unique_ptr<MetadataStore> store_;  // destroyed first: withdraws our record
};

}  // namespace kvferry::detail
