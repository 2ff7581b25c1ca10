// PrefillServer and KvSender: the prefill rank's side of the PD session layer.
//
// A PrefillServer listens for control connections from decode ranks, registers itself with
// the instance's bootstrap server (and re-registers every heartbeat interval: its liveness),
// and moves pages with the TransferEngine through the planner. For each request the
// serving stack creates a KvSender with the request's room id; once decode's destination
// arrives (WaitingForInput) it calls send() for every chunk chunked prefill produces.
//
// Each chunk becomes one plan per destination decode rank (same-TP or replicated MLA:
// build_transfer_plan; MHA with a TP mismatch: build_head_sliced_plan), executed with the
// strategy for the peer's transport on a worker queue chosen by the destination, so one slow
// decode rank never stalls transfers to another. Aux rows and state slots go with the last
// chunk, after its pages.
//
// Failure: a decode rank whose connection drops, goes silent past the heartbeat timeout, or
// whose transfers fail has its requests Failed; other decode ranks are served on. A decode
// that reconnects registers again and is accepted. Decode is told about a failure (and an
// abort is acknowledged) only after the request's in-flight writes have drained; then every
// destination already attached is told at once, and one that attaches later when it does.
//
// Room ownership: a room's destinations are the first required_dst_ranks distinct decode
// ranks (connections with distinct TP ranks) whose TransferRequests for it fit. Only they may
// abort it. A request that does not fit (a surplus destination, a TP rank the room already
// has, a second request on one connection, a mismatching required_dst_ranks) is answered
// RequestStatus Failed on its own connection, and the room goes on for its destinations.
//
// Ownership: the server borrows the engine (it must outlive the server) and owns its
// threads; a KvSender is a handle that keeps the request's state alive.
// Thread-safety: every method of PrefillServer and KvSender is thread-safe; send() calls for
// one request must come in chunk order (from one thread, or ordered by the caller).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/listener_limits.h"
#include "kvferry/metrics.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/pd_options.h"
#include "kvferry/pd/request_state.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::pd {

namespace detail {
struct SenderState;
class PrefillServerImpl;
}  // namespace detail

struct PrefillServerOptions {
  TransferEngine* engine = nullptr;  // borrowed
  RankBuffers buffers;
  TpRank tp;
  // The instance's bootstrap server, "host:port"; empty = do not register (tests).
  std::string bootstrap_address;
  std::string control_listen = "127.0.0.1:0";
  // Worker queues; each destination decode rank always uses the same one.
  int worker_shards = 2;
  PdTimeouts timeouts;
  // The control listener's limits (kvferry/listener_limits.h): connections in total and per
  // source, and hello_timeout, the time a connection has to send its RegisterLayout. A
  // registered connection that goes silent is closed by the heartbeat timeout instead.
  ListenerLimits control_limits{.max_connections = 256, .max_connections_per_source = 32};
  SendOptions send;
  // Rooms that decode's TransferRequests opened and the server still holds (until they
  // finish, or fail and are forgotten): at most max_open_rooms in all, and at most
  // max_open_rooms_per_decode opened by one decode connection, so a decode that opens rooms
  // without end can exhaust neither this process's memory nor the other decodes' share. A
  // request that would open one more is answered Failed (FailedPrecondition naming the
  // limit) and leaves nothing behind; requests for rooms already open, and the rooms the
  // serving stack opens (create_sender), are never refused. 0 = no limit.
  uint32_t max_open_rooms = 65'536;
  uint32_t max_open_rooms_per_decode = 16'384;
  // Count requests, transfer latency and bootstrap health (metrics()); off: nothing.
  bool metrics = false;
  PdIntegrity integrity;
};

// What goes with the last chunk.
struct LastChunkExtras {
  uint64_t aux_row = kNoSlot;     // this rank's aux row; kNoSlot = none
  uint64_t state_slot = kNoSlot;  // this rank's state slot; kNoSlot = none
};

class KvSender {
 public:
  KvSender() = default;
  uint64_t room() const;
  RequestState poll() const;
  Status failure() const;
  RequestState wait_final(std::chrono::milliseconds timeout) const;
  RequestState wait_at_least(RequestState state, std::chrono::milliseconds timeout) const;

  // Queues one chunk: this rank's `pages`, mapped to decode's next pages in order. Every
  // chunk but the last must hold whole pages of the prompt (page-aligned); the last one
  // carries `last` and its total must match decode's page count. Errors (nothing queued):
  // FailedPrecondition (not WaitingForInput/Transferring yet, or after the last chunk),
  // OutOfRange (more pages than decode gave), InvalidArgument (a planner error naming the
  // value), or the request's failure.
  Status send(std::span<const kv::PageIndex> pages, const LastChunkExtras* last = nullptr);
  // Fails the request and tells decode (after in-flight writes drained).
  void abort(const std::string& reason);

 private:
  friend class detail::PrefillServerImpl;
  explicit KvSender(std::shared_ptr<detail::SenderState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::SenderState> state_;
};

struct PrefillStats {
  uint64_t requests_succeeded = 0;
  uint64_t requests_failed = 0;
  uint64_t bytes_sent = 0;
  uint32_t decode_connections = 0;
  // Rooms the server holds: requests under way, and failed ones kept for a destination that
  // has yet to attach (one bootstrap timeout at most).
  uint64_t open_rooms = 0;
};

class PrefillServer {
 public:
  // Errors: InvalidArgument (no engine, bad listen address, bad TP), PeerUnreachable or the
  // bootstrap's error when registering fails.
  static Result<std::unique_ptr<PrefillServer>> create(PrefillServerOptions options);
  ~PrefillServer();
  PrefillServer(const PrefillServer&) = delete;
  PrefillServer& operator=(const PrefillServer&) = delete;

  // "host:port" of the control listener.
  const std::string& control_endpoint() const;
  // A sender for `room`. AlreadyExists if a live sender has that room.
  Result<KvSender> create_sender(uint64_t room);
  PrefillStats stats() const;
  // Requests by final state, transfer latency (first batch submitted to last byte in
  // decode's memory), bootstrap registrations; labelled role=prefill and endpoint=<control
  // endpoint>. Empty unless PrefillServerOptions::metrics.
  MetricsSnapshot metrics() const;

 private:
  explicit PrefillServer(std::unique_ptr<detail::PrefillServerImpl> impl);
  std::unique_ptr<detail::PrefillServerImpl> impl_;
};

}  // namespace kvferry::pd
