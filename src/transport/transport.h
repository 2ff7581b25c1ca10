// Transport: the one interface every way of moving bytes implements (local, shm, tcp,
// cuda_ipc; docs/TRANSPORTS.md is the contract in prose). The engine keeps one Transport
// per kind it serves, asks each which routes it can carry, and hands each a part of a batch
// through a per-peer TransportLink. Nothing in the engine names a concrete transport.
//
// A transport has two sides:
//  * passive: what it adds to this engine's segment descriptor (describe, prepare_region)
//    and whatever serves peers (tcp's listener and receiver threads);
//  * active: which routes to a peer it can carry (why_not), and connect(), which returns
//    the link that posts parts of batches to that peer.
//
// Ownership: the engine owns its transports and destroys them after every peer and batch
// that uses them (a link or a part keeps what it needs alive through shared_ptrs).
//
// Thread-safety: every method may be called concurrently from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kvferry/defaults.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "kvferry/transport_kind.h"
#include "metadata/segment_descriptor.h"
#include "transport/batch_progress.h"
#include "transport/cuda_memory_api.h"
#include "transport/peer_liveness.h"
#include "transport/region_index.h"
#include "transport/resolved_op.h"

namespace kvferry {

// Where a peer is, seen from this engine.
enum class PeerPlace : uint8_t { kSelf = 0, kSameHost, kOtherHost };

// What a route is chosen by (with the peer's place): the memory kind on each side of an op.
struct RouteKey {
  MemoryKind local = MemoryKind::kHost;
  MemoryKind remote = MemoryKind::kHost;
  friend bool operator==(RouteKey, RouteKey) = default;
};

struct TransportCapabilities {
  // What the transport touches of an op's two ranges (checked per op by the engine).
  CopyAccess access = CopyAccess::kRemoteAddress;
  // Memory kinds this transport reaches on this engine's side: a device region can be
  // registered only when a served transport reaches device memory (prepare_region).
  bool reaches_local_device = false;
  // The peer's shareable host memory must be mapped into this process (shm, cuda_ipc).
  bool maps_remote_host_memory = false;
  // The target runs threads that move the bytes (tcp's receiver); otherwise the target is
  // passive memory and the initiator does everything.
  bool target_runs_progress = false;
  // post() may copy on the calling thread: the engine posts such parts of a split batch
  // last, so a part whose post fails stops the batch before any byte moved.
  bool may_copy_in_post = false;
};

// What a transport is built from: the engine's settings it needs, and shared services.
struct TransportEnv {
  std::string engine_name;
  std::string listen_host;         // the handshake listener's host
  std::string tcp_listen_address;  // EngineOptions::tcp_listen_address
  int tcp_lanes = 4;               // EngineOptions::tcp_lanes
  int tcp_io_threads = 2;
  std::chrono::milliseconds connect_timeout = kDefaultHandshakeTimeout;
  std::optional<std::string> secret;
  ListenerLimits tcp_limits;                            // EngineOptions::tcp_limits
  uint32_t tcp_max_queued_replies = 1024;               // EngineOptions::tcp_max_queued_replies
  std::chrono::milliseconds tcp_stall_timeout{10'000};  // EngineOptions::tcp_stall_timeout
  // EngineOptions::frame_rest_timeout
  std::chrono::milliseconds frame_rest_timeout = kDefaultFrameRestTimeout;
  bool ucx_allow_emulated = false;  // EngineOptions::ucx_allow_emulated or its env variable
  uint64_t incarnation = 0;
  uint64_t inline_batch_bytes = 0;
  ThreadPool* workers = nullptr;  // the engine's copy workers
  // This engine's registered regions now (a receiver checks every request against them).
  std::function<std::shared_ptr<const RegionIndex>()> local_regions;
  // Opens the CUDA runtime API for transports that stage device memory (tcp); empty or
  // NotSupported where there is none. Called lazily: asking initialises CUDA.
  CudaMemoryApiOpener open_cuda_api;
  // tcp's device staging: pinned buffers of tcp_staging_buffer_bytes, at most
  // tcp_staging_buffers of them per engine (EngineOptions).
  uint64_t tcp_staging_buffer_bytes = 0;
  int tcp_staging_buffers = 0;
};

// The peer a link is opened to.
struct PeerInfo {
  const SegmentDescriptor& descriptor;
  const std::string& name;  // as it was opened ("host:port")
  std::shared_ptr<PeerLiveness> liveness;
  PeerPlace place = PeerPlace::kOtherHost;
};

// A transport's share of one batch: the ops routed to it, already checked on both sides and
// merged. Everything the pointers refer to is kept alive by `batch` until it ends.
struct BatchPart {
  const std::shared_ptr<BatchProgress>& batch;  // copy it to keep the batch beyond post()
  std::span<ResolvedOp> spans;                  // the transport may fill in ResolvedOp::remote
  uint64_t bytes = 0;                           // the sum of the spans' lengths
  const RegionIndex* local = nullptr;   // this engine's regions the batch was checked against
  const RegionIndex* remote = nullptr;  // the peer's (this engine's own for the self peer)
  uint64_t peer_incarnation = 0;
  void* after_cuda_event = nullptr;  // SubmitOptions::after_cuda_event
  bool touches_device = false;       // some span reads or writes device memory (either side)
};

// One transport's connection to one peer.
class TransportLink {
 public:
  virtual ~TransportLink() = default;
  // Starts the part: add_tasks, then each task ends in finish_task. An error returned here
  // means nothing of the part was started (and no task was added).
  virtual Status post(const BatchPart& part) = 0;
  // Closes what the link holds open; what it carries fails with PeerDisconnected. A later
  // post() may reconnect.
  virtual void shutdown() {}
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  virtual TransportCapabilities capabilities() const = 0;

  // Passive side: adds this transport's endpoints to the engine's descriptor.
  virtual void describe(SegmentDescriptor& /*self*/) const {}
  // Passive side: prepares a region being registered (cuda_ipc exports an IPC handle of
  // device memory). Called for device regions when reaches_local_device; an error refuses
  // the registration.
  virtual Status prepare_region(RegionEntry& /*entry*/) { return Status::Ok(); }
  // Passive side: called for every region being registered, of any memory kind, after
  // prepare_region (ucx maps it with UCX and stores its packed rkey in the entry). An error
  // refuses the registration; the engine then calls unregister_region for every transport
  // that had registered the region.
  virtual Status register_region(RegionEntry& /*entry*/) { return Status::Ok(); }
  // The region is gone (unregistered, or its registration was refused): no batch uses it.
  virtual void unregister_region(const RegionEntry& /*entry*/) {}
  // The same for several regions at once; returns once no peer can reach them through this
  // transport any more (cma fences its same-host sessions: one round trip for all of them).
  virtual void unregister_regions(std::span<const RegionEntry> entries) {
    for (const RegionEntry& e : entries) unregister_region(e);
  }

  // Why this transport cannot carry ops of `key` to this peer, or "" when it can. Whether
  // both engines serve it is the engine's check, not the transport's. `peer` is the peer's
  // descriptor without its regions (a route is chosen by memory kind, once per peer).
  virtual std::string why_not(RouteKey key, PeerPlace place,
                              const SegmentDescriptor& peer) const = 0;
  // Why this transport, although it can carry the route, should not win it in the
  // preference order (ucx without hardware RMA on both sides), or "". A forced transport
  // is not asked.
  virtual std::string why_not_preferred(RouteKey /*key*/, PeerPlace /*place*/,
                                        const SegmentDescriptor& /*peer*/) const {
    return "";
  }
  virtual Result<std::shared_ptr<TransportLink>> connect(const PeerInfo& peer) = 0;
  // The peer incarnation is gone (restarted or closed): drop what was opened for it.
  virtual void forget_peer(uint64_t /*incarnation*/) {}
};

using TransportFactory = std::function<Result<std::unique_ptr<Transport>>(const TransportEnv&)>;

}  // namespace kvferry
