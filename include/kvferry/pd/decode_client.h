// DecodeClient and KvReceiver: the decode rank's side of the PD session layer.
//
// For each request the serving stack creates a KvReceiver with the prefill instance's
// bootstrap address and the request's room id. The client finds the instance's prefill
// ranks through the bootstrap server (once per instance; later receivers reuse the
// connections), maps this decode rank to the prefill ranks it reads from (TP mismatch: one
// or several; replicated MLA with prefill TP > decode TP: one real sender, the others resolve
// without data), registers its KV layout with each over a control connection, and then the
// receiver is WaitingForInput. init() gives the request's destination pages, aux row and
// state slot; the receiver reports Success once every prefill rank it reads from did.
//
// Failure: heartbeats on every control connection, and the bootstrap server's /health of
// each instance with a request in flight; a prefill rank that closes its connection, goes
// silent past the heartbeat timeout, or is reported dead or restarted by the bootstrap
// server fails every pending request of its instance. Bootstrapping and Transferring are bounded by
// their timeouts. abort() tells prefill; wait_abort_acked() returns once prefill confirmed that
// none of the request's writes is still in flight (or, the link to it lost, once its writes would
// have timed out), so the pages can be reused.
//
// Ownership: the client borrows the engine (it must outlive the client) and owns its
// threads and connections; a KvReceiver is a handle that keeps its request's state alive and
// must not be used after the client is destroyed.
// Thread-safety: every method of DecodeClient and KvReceiver is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/metrics.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/pd_options.h"
#include "kvferry/pd/request_state.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::pd {

namespace detail {
struct ReceiverState;
class DecodeClientImpl;
}  // namespace detail

struct DecodeClientOptions {
  TransferEngine* engine = nullptr;  // borrowed
  RankBuffers buffers;
  TpRank tp;
  PdTimeouts timeouts;
  int bootstrap_threads = 2;
  // Count requests and bootstrap /health polls (metrics()); off: nothing.
  bool metrics = false;
  PdIntegrity integrity;
  // Test hook: runs after a prefill rank reported Success for `room` and before its pages
  // are verified (with integrity enabled), on the control connection's reader thread. Tests
  // use it to corrupt a landed page; empty in production.
  std::function<void(uint64_t room, uint32_t prefill_rank)> before_verify_for_test;
};

class KvReceiver {
 public:
  KvReceiver() = default;
  uint64_t room() const;
  RequestState poll() const;
  Status failure() const;
  RequestState wait_final(std::chrono::milliseconds timeout) const;
  RequestState wait_at_least(RequestState state, std::chrono::milliseconds timeout) const;

  // Gives the destination: every page of the request (in prompt order), and optionally the
  // aux row and state slot. May be called while still Bootstrapping (sent once ready).
  // Errors: FailedPrecondition (called twice), InvalidArgument (no pages), or the request's
  // failure when it failed before init (e.g. the bootstrap server or prefill refused it:
  // poll() is then Failed and failure() the same status); a failure after init shows only in
  // poll(), wait_final() and failure().
  Status init(std::vector<kv::PageIndex> dst_pages, uint64_t aux_row = kNoSlot,
              uint64_t state_slot = kNoSlot);
  // Fails the request and asks prefill to stop writing it.
  void abort(const std::string& reason);
  // OK once every prefill rank that may still write acknowledged the abort or is gone;
  // Timeout otherwise. A rank whose link was lost (killed, hung, partitioned) cannot
  // acknowledge, and writes of it already on the way may still land when it resumes or
  // the link heals: then this is OK only once its engine calls have timed out
  // (PdTimeouts::transfer_call_timeout, plus a heartbeat timeout, from the loss). Before it
  // returns OK, the engine's receivers have finished any copy of a write they had begun
  // (TransferEngine::wait_for_landings). So a failed request's pages are reused once this is
  // OK, whether decode aborted it or prefill reported it failed.
  Status wait_abort_acked(std::chrono::milliseconds timeout) const;
  // From the TransferRequest being sent to Success (zero before).
  std::chrono::nanoseconds transfer_time() const;

 private:
  friend class detail::DecodeClientImpl;
  explicit KvReceiver(std::shared_ptr<detail::ReceiverState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::ReceiverState> state_;
};

struct DecodeStats {
  uint64_t requests_succeeded = 0;
  uint64_t requests_failed = 0;
  uint32_t prefill_connections = 0;
};

class DecodeClient {
 public:
  // Errors: InvalidArgument (no engine, empty layout, bad TP).
  static Result<std::unique_ptr<DecodeClient>> create(DecodeClientOptions options);
  ~DecodeClient();
  DecodeClient(const DecodeClient&) = delete;
  DecodeClient& operator=(const DecodeClient&) = delete;

  // A receiver for `room` from the prefill instance whose bootstrap server is at
  // `bootstrap_address`. Errors: InvalidArgument (malformed address), AlreadyExists (a live
  // receiver has that room).
  Result<KvReceiver> create_receiver(const std::string& bootstrap_address, uint64_t room);
  DecodeStats stats() const;
  // Requests by final state and bootstrap /health polls, labelled role=decode and
  // endpoint=<the engine's endpoint>. Empty unless DecodeClientOptions::metrics.
  MetricsSnapshot metrics() const;

 private:
  explicit DecodeClient(std::unique_ptr<detail::DecodeClientImpl> impl);
  std::unique_ptr<detail::DecodeClientImpl> impl_;
};

}  // namespace kvferry::pd
