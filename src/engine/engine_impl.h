// EngineImpl: the TransferEngine behind its public facade (include/kvferry/transfer_engine.h
// states the contract and thread-safety). Split by concern:
//   engine_impl.cc        creation, registration, shared allocations, descriptor publishing
//   engine_peers.cc       open_peer, descriptor refresh, transport choice
//   engine_batches.cc     submit, status, wait, cancel
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/thread_pool.h"
#include "engine/batch_record.h"
#include "engine/copy_executor.h"
#include "engine/device_transport.h"
#include "engine/peer_monitor.h"
#include "engine/peer_state.h"
#include "engine/region_index.h"
#include "kvferry/transfer_engine.h"
#include "metadata/handshake.h"
#include "metadata/metadata_store.h"
#include "transport/shm/shm_mapping.h"
#include "transport/tcp/tcp_server.h"

namespace kvferry::detail {

class EngineImpl {
 public:
  static Result<std::unique_ptr<EngineImpl>> create(EngineOptions options);
  ~EngineImpl();

  const std::string& endpoint() const { return endpoint_; }
  const EngineOptions& options() const { return options_; }
  uint64_t incarnation() const { return incarnation_; }

  Status register_memory(std::span<const MemoryRegion> regions);
  Status unregister_memory(std::span<void* const> addrs);
  Result<SharedBuffer> allocate_shared(size_t bytes);
  Status free_shared(void* addr);

  Result<PeerHandle> open_peer(std::string_view name, const PeerOptions& options);

  void close_peer(const PeerHandle& peer);

  Result<BatchHandle> submit(const PeerHandle& peer, std::span<const TransferOp> ops,
                             const SubmitOptions& options);
  BatchStatus status(const BatchHandle& batch) const;
  BatchStatus wait(const BatchHandle& batch, std::chrono::milliseconds timeout) const;
  void cancel(const BatchHandle& batch);

  static const PeerState& peer_state(const PeerHandle& h) { return *h.state_; }

 private:
  explicit EngineImpl(EngineOptions options);

  // Registration helpers; registry_mu_ held.
  Status add_regions_locked(std::span<const MemoryRegion> regions);
  Status unregister_locked(std::span<void* const> addrs);
  // Rebuilds the descriptor and publishes it; the error is the store's.
  Status publish_locked();
  std::optional<ShmBacking> shm_backing_locked(uint64_t addr, uint64_t length) const;

  // Peers.
  Result<std::shared_ptr<PeerState>> connect_peer(const std::string& name,
                                                  const PeerOptions& options);
  Result<TransportKind> choose_transport(const SegmentDescriptor& d,
                                         std::optional<TransportKind> forced, bool is_self) const;
  // Builds the reachable view of a peer's regions; `map_shm` maps their memfds (shm).
  Result<std::shared_ptr<const RemoteSegment>> attach_segment(SegmentDescriptor d,
                                                              const RemoteSegment* previous,
                                                              bool map_shm) const;
  Status refresh_peer(PeerState& peer);
  // Drops what was opened for a peer incarnation that is gone (its IPC handles).
  void forget_incarnation(uint64_t incarnation);

  // The device transport (cuda_ipc), opened on first need so engines that never touch
  // device memory never initialise CUDA; the reason when there is none.
  Result<DeviceTransport*> device_transport() const;

  // Batches.
  static void enforce_deadline(BatchRecord& b);

  EngineOptions options_;
  uint64_t incarnation_ = 0;
  std::string endpoint_;
  TransportSet served_;
  std::optional<std::string> secret_;
  std::string tcp_endpoint_;

  // Registration. Writers serialise on registry_mu_; readers load the snapshot.
  mutable std::mutex registry_mu_;
  std::atomic<std::shared_ptr<const RegionIndex>> local_regions_;
  std::map<uint64_t, std::unique_ptr<ShmAllocation>> shared_allocations_;  // by address
  uint64_t descriptor_version_ = 0;
  std::atomic<std::shared_ptr<const std::string>> descriptor_json_;

  // Peers by the name they were opened with.
  std::mutex peers_mu_;
  std::unordered_map<std::string, std::shared_ptr<PeerState>> peers_;
  std::shared_ptr<PeerState> self_peer_;

  // Declared last: destroyed first, so no thread touches the state above after it dies.
  ThreadPool workers_;
  CopyExecutor copier_;
  PeerMonitor monitor_;
  mutable std::once_flag device_once_;
  mutable std::unique_ptr<DeviceTransport> device_;              // set once under device_once_
  mutable Status device_error_;                                  // why device_ is null
  mutable std::atomic<DeviceTransport*> device_ready_{nullptr};  // device_, once opened
  std::unique_ptr<HandshakeServer> handshake_;
  std::unique_ptr<TcpServer> tcp_server_;
  std::unique_ptr<MetadataStore> store_;  // destroyed first: withdraws our record
};

}  // namespace kvferry::detail
