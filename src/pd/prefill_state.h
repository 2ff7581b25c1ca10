// Internal state of the prefill side: decode peers (one per control connection), per-request
// sender state, and the server implementation that owns both.
//
// Locking: PrefillServerImpl::mu_ guards the peer and room maps; SenderState::mu guards one
// request. Never take mu_ while holding a SenderState::mu.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/acceptor.h"
#include "core/fd.h"
#include "core/log_throttle.h"
#include "core/net.h"
#include "core/periodic_task.h"
#include "core/thread_pool.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/prefill_server.h"
#include "pd/control_channel.h"
#include "pd/page_integrity.h"
#include "pd/pd_metrics.h"

namespace kvferry::pd::detail {

// One connected decode rank.
//
// The registration fields are written once, by a reading turn of the connection, before the
// peer can appear in any request (on_request runs in its turns too), so every later reader
// sees them through SenderState::mu. The name is different: it changes on
// registration while other threads (workers, the monitor, callers of send()) may be
// formatting a message with it, so it sits behind its own mutex.
struct DecodePeer {
  explicit DecodePeer(uint64_t peer_id)
      : id(peer_id), name_("decode connection " + std::to_string(peer_id)) {}

  const uint64_t id;
  std::shared_ptr<ControlChannel> channel;  // set before reading starts; never reassigned
  ConnectionSlot slot;                      // the connection's place against control_limits
  const Clock::time_point accepted = Clock::now();
  std::atomic<bool> registered{false};  // written by the connection's reading turns only
  // The connection's authentication challenge (pd/control_auth.h), and whether it was
  // answered: with a secret, nothing else is accepted before. Reading turns only.
  AuthChallengeMessage challenge;
  bool authenticated = false;
  RegisterLayout registration;
  kv::KvLayout layout;
  PeerHandle engine_peer;
  std::atomic<bool> alive{true};
  // Rooms this connection's requests opened that the server still holds (under the
  // server's mu_).
  uint32_t rooms_opened = 0;

  // "decode connection N" until registered, then "decode tp d/D @ endpoint". Thread-safe.
  std::string name() const {
    std::lock_guard lock(name_mu_);
    return name_;
  }
  void rename(std::string name) {
    std::lock_guard lock(name_mu_);
    name_ = std::move(name);
  }

 private:
  mutable std::mutex name_mu_;
  std::string name_;
};

struct Destination {
  std::shared_ptr<DecodePeer> peer;
  TransferRequest request;
  bool last_done = false;
  bool told = false;     // was sent the room's final state
  PageDigester digests;  // with integrity enabled: what this rank wrote to the peer's pages
};

struct SenderState {
  SenderState(uint64_t room_id, PrefillServerImpl* owner)
      : room(room_id), server(owner), created(Clock::now()) {}

  const uint64_t room;
  PrefillServerImpl* const server;
  const Clock::time_point created;
  RequestStatusCell cell{RequestState::kBootstrapping};

  std::mutex mu;
  bool claimed = false;  // create_sender was called
  uint32_t required = 0;
  std::vector<Destination> dsts;
  uint64_t pages_sent = 0;
  bool last_queued = false;
  int inflight = 0;
  // Metrics: when the request's first engine batch was submitted (0: not yet), since the
  // steady clock's epoch.
  std::atomic<int64_t> first_post_ns{0};
  bool notified = false;  // every required destination was told the final state
  std::vector<std::shared_ptr<DecodePeer>> ack_to;  // abort acks owed once drained
  // The decode connection whose request opened the room (null: create_sender did); counted
  // against its share of PrefillServerOptions::max_open_rooms* until the room is forgotten.
  // Set once, under the server's mu_.
  std::shared_ptr<DecodePeer> opener;
  // When the monitor first saw it failed while it was still held (monitor thread, under the
  // server's mu_).
  Clock::time_point failed_seen{};
};

// Warnings a decode connection can cause at will (any client, before it authenticated or
// registered; a registered one, with each refused request): one line per interval each.
struct ConnectionWarnings {
  LogThrottle refused;     // wrong secret, frames before the proof, refused registrations
  LogThrottle unfinished;  // connections lost or closed before they registered
  LogThrottle requests;    // refused requests and aborts, statuses that could not be sent
};

class PrefillServerImpl {
 public:
  explicit PrefillServerImpl(PrefillServerOptions options);
  ~PrefillServerImpl();

  Status start();
  const std::string& control_endpoint() const { return control_endpoint_; }
  Result<KvSender> create_sender(uint64_t room);
  PrefillStats stats() const;
  MetricsSnapshot metrics() const;

  // --- Used by KvSender (kv_sender.cc).
  Status send_chunk(const std::shared_ptr<SenderState>& s, std::span<const kv::PageIndex> pages,
                    const LastChunkExtras* last);
  void fail(const std::shared_ptr<SenderState>& s, const Status& reason);
  // Reports the final state to decode and owed abort acks once nothing is in flight.
  void finish_if_drained(const std::shared_ptr<SenderState>& s);

 private:
  void on_accepted(Fd fd, ConnectionSlot slot);
  void monitor_loop();
  void on_message(const std::shared_ptr<DecodePeer>& peer, ControlMessage&& message);
  // With a secret: true once `peer` proved it (an AuthProof is consumed: false). Anything
  // else before the proof is refused (Unauthenticated) and closes the connection.
  bool authenticate(const std::shared_ptr<DecodePeer>& peer, const ControlMessage& message);
  void on_close(const std::shared_ptr<DecodePeer>& peer, const Status& reason);
  void on_register(const std::shared_ptr<DecodePeer>& peer, RegisterLayout&& reg);
  void on_request(const std::shared_ptr<DecodePeer>& peer, TransferRequest&& request);
  // OK when `peer` may become a destination of room `s` (a distinct registered decode rank,
  // while the room has fewer than its required destinations); why not otherwise. Called with
  // s.mu held.
  Status admit_destination(const SenderState& s, const DecodePeer& peer,
                           const TransferRequest& request) const;
  // Room `room`, opened for `peer` if it is not open and the limits allow
  // (PrefillServerOptions::max_open_rooms*); why not otherwise.
  Result<std::shared_ptr<SenderState>> room_for_request(const std::shared_ptr<DecodePeer>& peer,
                                                        uint64_t room);
  // Answers `peer` with RequestStatus Failed for `room`, leaving the room alone.
  void refuse_request(const std::shared_ptr<DecodePeer>& peer, uint64_t room, const Status& why);
  void on_abort(const std::shared_ptr<DecodePeer>& peer, const AbortMessage& abort);
  // One registration with the bootstrap server: the first (register_at_start), then one per
  // heartbeat interval on its own thread (registration_), so a bootstrap server that does not
  // answer holds that thread for the call's timeout, never the monitor's timeouts.
  Status register_with_bootstrap();
  // The first registration, retried while what stops it can pass (see the definition).
  Status register_at_start();
  Result<kv::TransferPlan> plan_chunk(const Destination& dst, std::span<const kv::PageIndex> pages,
                                      uint64_t dst_offset) const;
  Status plan_extras(const Destination& dst, const LastChunkExtras& last,
                     std::vector<kv::TransferPlan>& plans) const;
  void run_plans(const std::shared_ptr<SenderState>& s, const std::shared_ptr<DecodePeer>& peer,
                 const std::vector<kv::TransferPlan>& plans, bool last);
  void send_status(const std::shared_ptr<DecodePeer>& peer, const ControlMessage& message);
  void forget_room(uint64_t room, const SenderState* s);

  PrefillServerOptions options_;
  TransferEngine& engine_;
  std::unique_ptr<Acceptor> acceptor_;  // the control listener
  std::string control_endpoint_;
  // The payload cap of a connection that has not registered (pd/control_auth.h); set by
  // start(), before the first connection.
  uint32_t registration_payload_limit_ = 0;
  ConnectionWarnings warnings_;
  // Connections closed before they registered since the monitor last gave freed memory back
  // to the system (their buffers were freed, but the allocator keeps freed memory), and when
  // it did (monitor thread only).
  std::atomic<uint32_t> unregistered_closed_{0};
  Clock::time_point last_trim_;
  std::atomic<bool> stopping_{false};
  std::thread monitor_thread_;
  std::unique_ptr<PeriodicTask> registration_;  // with a bootstrap address only
  std::vector<std::unique_ptr<ThreadPool>> shards_;
  // Every control channel's reading turns and heartbeats (declared before the channels: it
  // outlives them).
  ControlHub control_hub_;

  mutable std::mutex mu_;
  uint64_t next_peer_id_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<DecodePeer>> peers_;
  // Every control channel started and not yet destroyed, including those whose on_close
  // already removed their peer from peers_: the destructor closes each (which joins its
  // reader, so no on_close still runs on `this` once it returns).
  std::vector<std::weak_ptr<ControlChannel>> channels_;
  std::unordered_map<uint64_t, std::shared_ptr<SenderState>> rooms_;
  uint64_t rooms_opened_by_decode_ = 0;  // of rooms_, those with an opener
  PrefillStats stats_;
  std::unique_ptr<PdMetrics> metrics_;  // PrefillServerOptions::metrics, else null
};

}  // namespace kvferry::pd::detail
