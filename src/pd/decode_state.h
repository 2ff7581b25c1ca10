// Internal state of the decode side: prefill instances (found through one bootstrap server
// each), their control links (one per prefill rank this decode rank reads from), and
// per-request receiver state.
//
// Locking: DecodeClientImpl::mu_ guards the instance and room maps and each instance's
// phase; ReceiverState::mu guards one request; PrefillLink::mu its registration reply.
// Order: mu_ before ReceiverState::mu; never mu_ while holding a ReceiverState::mu.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/log_throttle.h"
#include "core/net.h"
#include "core/thread_pool.h"
#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/decode_client.h"
#include "pd/control_channel.h"
#include "pd/pd_metrics.h"

namespace kvferry::pd::detail {

struct PrefillLink {
  uint32_t prefill_rank = 0;
  std::shared_ptr<ControlChannel> channel;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<RegisterReply> reply;
  std::atomic<bool> alive{true};
};

struct PrefillInstance {
  enum class Phase { kConnecting, kReady, kDead };
  std::string bootstrap_address;
  Phase phase = Phase::kConnecting;  // guarded by DecodeClientImpl::mu_
  Status error;                      // why kDead
  // Why the latest attempt to reach the instance failed (guarded by mu_): a Bootstrapping
  // timeout reports this code, so the caller learns why it timed out.
  Status last_attempt_error;
  InstanceLayout layout;
  std::vector<uint32_t> ranks;  // prefill ranks this decode rank reads from
  std::map<uint32_t, std::shared_ptr<PrefillLink>> links;
  // When the bootstrap server last answered for the instance (connected, then its polls).
  Clock::time_point last_healthy = Clock::now();
  // A /health poll of the instance is queued or running (at most one is): set by the
  // monitor thread, cleared by the poll once it has written the two fields below.
  std::atomic<bool> health_polling{false};
  // The bootstrap server's unanswered polls in a row (at most kMaxHealthMisses), and when to
  // poll it next: each one unanswered doubles the wait, from one heartbeat interval.
  int health_misses = 0;
  Clock::time_point next_health_poll{};
};

struct ReceiverState {
  ReceiverState(uint64_t room_id, DecodeClientImpl* owner, std::shared_ptr<PrefillInstance> inst)
      : room(room_id), client(owner), instance(std::move(inst)), created(Clock::now()) {}

  const uint64_t room;
  DecodeClientImpl* const client;
  const std::shared_ptr<PrefillInstance> instance;
  const Clock::time_point created;
  RequestStatusCell cell{RequestState::kBootstrapping};

  mutable std::mutex mu;
  mutable std::condition_variable ack_cv;
  bool has_input = false;
  TransferRequest input;
  bool sent = false;
  Clock::time_point transfer_start{};
  Clock::time_point transfer_end{};
  std::set<uint32_t> pending_ranks;      // ranks yet to report Success
  std::set<uint32_t> ack_pending_ranks;  // ranks yet to acknowledge an abort
  // A prefill link lost while this request was sent: its engine may still deliver writes
  // already on the way (a partitioned link retransmits them when it heals) until its engine
  // call times out, so the pages are not given back before this (wait_abort_acked).
  Clock::time_point fenced_until{};
  bool counted = false;  // in the stats
};

class DecodeClientImpl {
 public:
  explicit DecodeClientImpl(DecodeClientOptions options);
  ~DecodeClientImpl();
  Status start();

  Result<KvReceiver> create_receiver(const std::string& bootstrap_address, uint64_t room);
  DecodeStats stats() const;
  MetricsSnapshot metrics() const;

  // --- Used by KvReceiver (kv_receiver.cc).
  Status init(const std::shared_ptr<ReceiverState>& r, std::vector<kv::PageIndex> pages,
              uint64_t aux_row, uint64_t state_slot);
  void abort(const std::shared_ptr<ReceiverState>& r, const Status& reason);
  void fail(const std::shared_ptr<ReceiverState>& r, const Status& reason);
  const TransferEngine& engine() const { return engine_; }

 private:
  void connect_instance(const std::shared_ptr<PrefillInstance>& inst);
  Status connect_links(const std::shared_ptr<PrefillInstance>& inst);
  Result<std::shared_ptr<PrefillLink>> connect_link(const std::shared_ptr<PrefillInstance>& inst,
                                                    const BootstrapClient& bootstrap,
                                                    uint32_t prefill_rank,
                                                    Clock::time_point deadline);
  void dispatch(const std::shared_ptr<ReceiverState>& r);
  void on_message(const std::shared_ptr<PrefillInstance>& inst, uint32_t rank,
                  ControlMessage&& message);
  void on_link_lost(const std::shared_ptr<PrefillInstance>& inst, uint32_t rank,
                    const Status& reason);
  // With integrity enabled: the rank's page digests match the pages as they landed.
  Status verify_rank(const std::shared_ptr<ReceiverState>& r, uint32_t rank,
                     const RequestStatusMessage& status);
  void kill_instance(const std::shared_ptr<PrefillInstance>& inst, const Status& reason);
  std::shared_ptr<ReceiverState> find_room(uint64_t room) const;
  void settle(const std::shared_ptr<ReceiverState>& r);
  void monitor_loop();
  // Queues a /health poll of `inst` on the bootstrap pool, unless one is still out or its
  // server's silence put the next one off.
  void poll_health(const std::shared_ptr<PrefillInstance>& inst, Clock::time_point now);
  void check_health(const std::shared_ptr<PrefillInstance>& inst);
  RegisterLayout registration() const;
  bool replicated() const;

  DecodeClientOptions options_;
  TransferEngine& engine_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<ThreadPool> bootstrap_pool_;
  std::thread monitor_thread_;
  // Every control channel's reading turns and heartbeats (declared before the channels: it
  // outlives them).
  ControlHub control_hub_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<PrefillInstance>> instances_;
  // Every control channel started and not yet destroyed, also those of links no instance
  // holds any more (lost, refused, replaced): the destructor closes each, which joins its
  // reader, so no callback still runs on `this` once it returns.
  std::vector<std::weak_ptr<ControlChannel>> channels_;
  std::unordered_map<uint64_t, std::shared_ptr<ReceiverState>> rooms_;
  DecodeStats stats_;
  std::unique_ptr<PdMetrics> metrics_;  // DecodeClientOptions::metrics, else null
  LogThrottle health_log_;              // a bootstrap server may stay silent for long
};

}  // namespace kvferry::pd::detail
