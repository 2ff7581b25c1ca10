// TransferEngine: registers memory, finds peers, and moves bytes between this process's
// registered memory and a peer's, in batches of one-sided WRITE and READ operations.
//
// Model (close to Mooncake's Transfer Engine and NIXL's agent):
//  * Memory is registered once. Every op is checked before a byte moves: its local range
//    must lie inside one local region, its remote range inside one region the peer
//    advertises. A peer never writes outside what it was told is registered.
//  * A peer is named "host:port", the endpoint of its handshake listener. open_peer fetches
//    the peer's segment descriptor (regions, transports it serves, an incarnation id that
//    changes when the peer restarts) and caches it.
//  * submit() validates, merges adjacent ops, routes each op by where its memory lives
//    (local kind, remote kind, same host or not) to the best transport both sides serve, and
//    posts; a batch whose ops need different routes is split and ends once every part has
//    (the first error wins). The returned BatchHandle ends in Completed or in a typed error within
//    the batch's timeout; completion means the bytes are in the destination's memory.
//
// Ownership: the engine owns its listener, worker threads, shared allocations and peer
// mappings. BatchHandle and PeerHandle are reference-counted views that may outlive
// nothing: destroy every handle before the engine.
//
// Thread-safety: every TransferEngine method is safe to call concurrently from any
// number of threads unless its comment says otherwise. No global lock is taken on the
// data path (submit/status/wait).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/defaults.h"
#include "kvferry/listener_limits.h"
#include "kvferry/metrics.h"
#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "kvferry/transport_kind.h"

namespace kvferry {

class BatchProgress;
namespace detail {
struct PeerState;
class EngineImpl;
}  // namespace detail

struct EngineOptions {
  std::string name = "kvferry";
  // Handshake listener, "host:port". Port 0 picks a free port (see endpoint()). "0.0.0.0"
  // listens on every interface (endpoints() lists where), as do the tcp data and
  // notification listeners then; beyond loopback without a secret, any host that reaches the
  // port can read and write registered memory (logged once as a warning).
  std::string listen_address = "127.0.0.1:0";
  // Where peers find each other: "p2p" (embedded handshake, the default),
  // "etcd://host:port[,host:port...]" or "redis://host:port".
  std::string metadata_uri = "p2p";
  // Lifetime of this engine's record in etcd/redis, renewed every third of it: a killed
  // engine's record disappears after at most this long.
  std::chrono::seconds metadata_ttl{10};
  // Transports this engine serves and may use. Empty = all built ones.
  TransportSet allowed_transports{};
  // When set, every op to every peer goes over this transport: open_peer fails (saying why)
  // when it can reach none of the peer's memory, and a batch with an op it cannot carry is
  // refused before anything moves, naming the op.
  std::optional<TransportKind> forced_transport;
  // Worker threads for large batches (local and shm copies), started as the first such
  // batches come: an engine that never copies runs none.
  int worker_threads = 2;
  // Default batch timeout (submit can override).
  std::chrono::milliseconds batch_timeout{30'000};
  // Timeout for fetching a peer's descriptor.
  std::chrono::milliseconds handshake_timeout = kDefaultHandshakeTimeout;
  // Merge ops that are contiguous on both sides before posting.
  bool merge_ops = true;
  // Batches with at most this many bytes run on the submitting thread; larger ones are
  // split over the workers in slices of at least 1 MiB (about four per worker), claimed by
  // whoever is free (a thread waiting for the batch included), so a late worker costs at
  // most one slice. Why 4 MiB: src/transport/local/copy_executor.h. The cma transport uses
  // at most 2 MiB (its system-call copy gains from a second thread sooner).
  uint64_t inline_batch_bytes = 4u << 20;
  // tcp transport: data listener ("host:port"; empty = the listen_address host, any
  // port), connections per peer, and receiver I/O threads. Four lanes, not two, even on two
  // cores: with two streams both cores idled ~12 % in a large batch (each lane's sender and
  // receiver blocked at once); docs/TRANSPORTS.md "tcp lanes".
  std::string tcp_listen_address;
  int tcp_lanes = 4;
  int tcp_io_threads = 2;
  // tcp with device memory: bytes are staged through pinned host buffers of this size,
  // at most this many per engine (allocated on first use). When all are in use, device
  // chunks wait for one (bounded by their batch's deadline); nothing else is allocated.
  // The receiver keeps one buffer per I/O thread besides.
  uint64_t tcp_staging_buffer_bytes = 4u << 20;
  int tcp_staging_buffers = 8;
  // Shared secret: when set (or KVFERRY_SECRET is set in the environment), nothing of this
  // engine is served to a peer that has not proved knowledge of it (HMAC-SHA256
  // challenge-response): its descriptor over the p2p handshake, its tcp data connections,
  // its shared memory (the memfds are passed only to an authenticated peer). This engine
  // proves it to peers that require it. The PD session layer on this engine uses the same
  // secret (README, Security).
  std::optional<std::string> secret;
  // What clients of this engine's listeners may hold and how long they may take
  // (kvferry/listener_limits.h; docs/PROTOCOL.md, "Listener limits"): the p2p handshake
  // (hello_timeout bounds one whole request and reply) and the tcp data receiver
  // (hello_timeout bounds the hello and authentication; an idle lane is closed after
  // idle_timeout and reopened by its initiator on next use).
  ListenerLimits handshake_limits;
  ListenerLimits tcp_limits{.idle_timeout = std::chrono::minutes(5)};
  // tcp receiver: replies queued on one connection before it stops reading from a peer
  // that does not read them; and how long a request whose payload stopped coming, or a
  // queued reply the peer does not take, may go without progress before the connection is
  // closed, releasing the region it pinned (also for requests without a deadline).
  uint32_t tcp_max_queued_replies = 1024;
  std::chrono::milliseconds tcp_stall_timeout{10'000};
  // Data planes, both ends: once the first byte (or header) of a frame has arrived, the whole
  // frame must be in within this long, however its bytes trickle in. A tcp receiver closes a
  // connection whose frame takes longer (and the initiator one whose answer does), releasing
  // the region the frame pinned; a ucx target drops a rendezvous write that takes longer,
  // landing nothing of it.
  std::chrono::milliseconds frame_rest_timeout = kDefaultFrameRestTimeout;
  // ucx transport: use UCX paths that emulate put/get in the target's software (UCX's tcp
  // and shared-memory transports) — also when KVFERRY_UCX_ALLOW_EMULATED=1 is set. Such
  // paths neither bounds-check a put against the target's registration nor authenticate
  // the peer: a hostile peer could write anywhere in this process (docs/TRANSPORTS.md).
  // Off: ucx is used only where UCX has a hardware RMA transport, whose NIC checks rkeys.
  bool ucx_allow_emulated = false;
  // Count bytes, batches, failures and latencies (kvferry/metrics.h). Off: nothing is
  // counted and metrics() is empty.
  bool metrics = false;
  // Notifications (send_notification, SubmitOptions::notification): the largest message this
  // engine sends or accepts, and how many received ones, in how many bytes, it keeps until
  // get_notifications drains them. One sender holds at most its share of each (a sender over
  // it is not read, so its notifications may time out, while others still get in).
  size_t max_notification_bytes = kDefaultMaxNotificationBytes;
  size_t max_pending_notifications = kDefaultMaxPendingNotifications;
  size_t max_pending_notification_bytes = kDefaultMaxPendingNotificationBytes;
};

struct PeerOptions {
  // Overrides EngineOptions::forced_transport for this peer.
  std::optional<TransportKind> transport;
};

// When a batch that carries a notification reports Completed (SubmitOptions).
enum class NotificationCompletion : uint8_t {
  // Once the peer has acknowledged the notification (it is in the peer's inbox). One that
  // could not be delivered fails the batch (PeerDisconnected, Timeout, ...) although its
  // bytes moved.
  kAcknowledged,
  // Once every byte is in place and the notification is queued on the ordered channel to
  // the peer, ahead of any this engine sends it later (NIXL's semantics). The peer receives
  // it after the data, in order, unless it dies or cannot take it before the batch's
  // deadline: then it is lost (logged as a warning) and the batch stays Completed. A
  // stalled peer (paused, overloaded) does not hold the batch up.
  kQueued,
};

struct SubmitOptions {
  // Zero = EngineOptions::batch_timeout.
  std::chrono::milliseconds timeout{0};
  // cuda_ipc only: a cudaEvent_t of this process (recorded by the producer of the bytes,
  // e.g. after the prefill kernels). The copies are ordered after it on the device
  // (cudaStreamWaitEvent); no CPU thread blocks on it. Must stay valid until submit
  // returns. A batch that does not run on a device copy engine refuses it
  // (InvalidArgument).
  void* after_cuda_event = nullptr;
  // A message for the peer (the batch's target: for READ, the peer read from), delivered
  // once every byte of the batch is in place. When the batch reports Completed:
  // `notification_completion`. Errors at submit: InvalidArgument (larger than
  // max_notification_bytes, naming the size), NotSupported (the peer takes no
  // notifications).
  std::optional<std::string> notification{};
  NotificationCompletion notification_completion = NotificationCompletion::kAcknowledged;
};

// A notification received from a peer engine (get_notifications).
struct Notification {
  enum class Kind : uint8_t {
    kMessage = 0,     // `bytes` is the message
    kSenderLost = 1,  // the sender's connection ended uncleanly (it died, or the network
                      // broke): `bytes` says why. Nothing it sent before is lost.
  };
  Kind kind = Kind::kMessage;
  std::string sender;           // the sender's EngineOptions::name
  std::string sender_endpoint;  // the sender's endpoint() (what open_peer takes)
  uint64_t sender_incarnation = 0;
  std::string bytes;
};

// A peer opened by open_peer. Cheap to copy.
class PeerHandle {
 public:
  PeerHandle() = default;
  bool valid() const { return state_ != nullptr; }
  const std::string& name() const;
  // The transport of the peer's preferred route: to its device memory if it advertises
  // some and a route reaches it, else to its shared host memory, else to its host memory.
  // One batch may use several routes; routes() lists them all.
  TransportKind transport() const;
  // The route for each pair of (local, remote) memory kinds: the transport chosen, or why
  // none reaches. Chosen once per peer, on first need (asking may initialise CUDA).
  std::vector<Route> routes() const;
  // The peer's incarnation id (changes when the peer process restarts).
  uint64_t incarnation() const;

 private:
  friend class detail::EngineImpl;
  explicit PeerHandle(std::shared_ptr<detail::PeerState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::PeerState> state_;
};

// A submitted batch. Cheap to copy; the batch lives while a handle or a worker holds it.
class BatchHandle {
 public:
  BatchHandle() = default;
  bool valid() const { return state_ != nullptr; }

 private:
  friend class detail::EngineImpl;
  explicit BatchHandle(std::shared_ptr<BatchProgress> s) : state_(std::move(s)) {}
  std::shared_ptr<BatchProgress> state_;  // an engine's detail::BatchRecord
};

// Memory handed out by allocate_shared: shareable with same-host peers through shm.
struct SharedBuffer {
  void* addr = nullptr;
  size_t length = 0;
};

class TransferEngine {
 public:
  // Starts the handshake listener and workers. Errors: InvalidArgument for a malformed
  // option (naming it), Internal if the listener cannot bind.
  static Result<std::unique_ptr<TransferEngine>> create(EngineOptions options);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // "host:port" peers use to reach this engine: endpoints().front().
  const std::string& endpoint() const;
  // Every "host:port" a peer may reach this engine at, in the order to try them. One, unless
  // listen_address is "0.0.0.0:port" (every interface): then one per IPv4 interface address
  // that is up and not loopback, in the kernel's order (127.0.0.1 only where there is none).
  const std::vector<std::string>& endpoints() const;
  const EngineOptions& options() const;
  uint64_t incarnation() const;
  // The secret this engine proves and requires (EngineOptions::secret, else KVFERRY_SECRET;
  // none = authentication off), so the layers above it (the PD control channel and
  // bootstrap client) prove the same one. Thread-safe (fixed at creation).
  const std::optional<std::string>& secret() const;

  // Registers a region. Errors: InvalidArgument (null, zero length, or host memory not
  // mapped readable in this process: every region of a call is checked against one read of
  // /proc/self/maps), AlreadyExists (overlaps a registered region). The batch form
  // registers all or none and publishes the descriptor once. Memory must stay mapped until
  // it is unregistered; a tcp write a peer sends into registered memory that was unmapped
  // anyway fails with NotRegistered (the receiver survives), as does a copy into it through
  // the Python API's byte helpers.
  Status register_memory(void* addr, size_t length, MemoryLocation location = {});
  Status register_memory(std::span<const MemoryRegion> regions);
  // Errors: NotRegistered (no region starts at addr), FailedPrecondition (a batch in
  // flight uses it). The batch form unregisters all or none. Same-host peers that mapped
  // a shared region keep their mapping, but their ops submitted after this returns fail
  // with NotRegistered and write nothing (the allocation's guard word, docs/TRANSPORTS.md).
  Status unregister_memory(void* addr);
  Status unregister_memory(std::span<void* const> addrs);

  // The location of the registered region that holds all of [addr, addr + length), for
  // callers that take an address from elsewhere and must touch only memory this engine was
  // given (the Python API's byte helpers). NotRegistered, naming the range, when no single
  // region holds it. Lock-free (a lookup in the current registration snapshot); another
  // thread may unregister the region right after it returns.
  Result<MemoryLocation> registered_location(const void* addr, size_t length) const;

  // Allocates `bytes` (rounded up to the page size) of shared memory, registered, that
  // same-host peers reach through shm. Freed when the engine is destroyed or by
  // free_shared (which unregisters it: peers' later ops to it fail, see unregister_memory;
  // a later allocation at the same address is another memfd, which peers find by
  // refreshing the descriptor). Errors: FailedPrecondition when one allocation would hold
  // more than 512 registrations at once.
  Result<SharedBuffer> allocate_shared(size_t bytes);
  Status free_shared(void* addr);

  // Opens (or returns the cached) peer "host:port". The engine's own endpoint yields the
  // local transport. Errors: InvalidArgument (malformed name), PeerUnreachable (no
  // answer within handshake_timeout), ProtocolError (bad descriptor), NotSupported
  // (a forced transport that cannot reach this peer, saying why).
  Result<PeerHandle> open_peer(std::string_view name, const PeerOptions& options = {});

  // Asks the peer for its descriptor afresh (a real handshake, never the cache), waiting at
  // most `timeout`: OK when it answered with a descriptor that parses. Opens nothing and
  // changes no cached peer. Errors: InvalidArgument (malformed name), PeerUnreachable (no
  // answer in time), ProtocolError (a reply that does not parse). Thread-safe.
  Status probe_peer(std::string_view name, std::chrono::milliseconds timeout);

  // Forgets the peer: batches to it still running stop with PeerDisconnected, later
  // submissions through any handle to it fail with PeerDisconnected ("closed"), and its
  // mappings are released once nothing uses them. open_peer connects afresh.
  void close_peer(const PeerHandle& peer);

  // Validates every op, merges, and posts. Small batches may complete before submit
  // returns. Errors before anything is posted: InvalidArgument (zero length, empty
  // batch, two ops whose destinations overlap: the message names both), NotRegistered (an
  // address outside the local or the peer's regions; the message names it),
  // PeerDisconnected (the peer is gone), Timeout (a tcp lane that had to be connected first
  // was not, before the batch's deadline). Never blocks past the batch's deadline.
  Result<BatchHandle> submit(const PeerHandle& peer, std::span<const TransferOp> ops,
                             const SubmitOptions& options = {});

  // The batch's state now. Never waits for an answer: it takes in, on the calling thread, the
  // answers that have arrived for the batch (tcp: a READ's payload lands then), so polling
  // sees a batch complete as soon as its last answer is in.
  BatchStatus status(const BatchHandle& batch) const;
  // Waits until the batch ends or `timeout` passes (then the state is still kPending and
  // the batch keeps running until its own timeout). A batch past its own timeout is
  // cancelled and ends in Timeout; no byte of it lands after wait returns. With a
  // positive timeout the calling thread copies parts of the batch no worker has started
  // yet (so it may return up to one slice later than `timeout`).
  BatchStatus wait(const BatchHandle& batch, std::chrono::milliseconds timeout) const;
  // Stops the batch: ops not yet started never run; returns once nothing of it is being
  // copied. The batch ends in Cancelled unless it had already ended.
  void cancel(const BatchHandle& batch);

  // As a target: returns once every write of a peer that this process's receivers had begun
  // to land when it was called has landed or been refused (bounded by one receive or copy,
  // never a wait for a peer). A receiver begins a write no later than 2 ms before its
  // deadline; call this after learning that a request failed and before reusing its memory,
  // so that a receiving thread descheduled mid-copy cannot land a byte of it afterwards.
  void wait_for_landings() const;

  // Convenience: submit then wait up to the batch timeout; returns the final status.
  Status transfer_sync(const PeerHandle& peer, std::span<const TransferOp> ops,
                       const SubmitOptions& options = {});

  // Notifications. A message of at most max_notification_bytes to the peer, delivered over
  // an ordered, authenticated (when a secret is set) connection per peer: one sender's
  // notifications, standalone or attached to batches, reach the peer in the order they were
  // sent (a batch's when it completes). Returns once the peer acknowledged it, or the error:
  // InvalidArgument (too large, naming the size), NotSupported (the peer takes none),
  // PeerDisconnected (the peer died, restarted or was closed), PeerUnreachable,
  // Unauthenticated, Timeout (zero `timeout` = batch_timeout). Thread-safe.
  Status send_notification(const PeerHandle& peer, std::string_view bytes,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds{0});
  // Takes up to `max` received notifications, oldest first (per sender in send order);
  // never blocks. Thread-safe.
  std::vector<Notification> get_notifications(size_t max = SIZE_MAX);

  // What this engine counted (labelled engine=<options().name>); empty unless
  // EngineOptions::metrics. Safe to call at any time from any thread.
  MetricsSnapshot metrics() const;

 private:
  friend class detail::EngineImpl;
  explicit TransferEngine(std::unique_ptr<detail::EngineImpl> impl);
  std::unique_ptr<detail::EngineImpl> impl_;
};

}  // namespace kvferry
