// DecodeClient: finding prefill instances, control links, messages, heartbeats, timeouts.
// The per-request path is in kv_receiver.cc.
#include "kvferry/pd/decode_client.h"

#include <algorithm>

#include "core/logging.h"
#include "core/named_thread.h"
#include "kvferry/kv/tp_slice.h"
#include "pd/control_auth.h"
#include "pd/decode_state.h"
#include "pd/page_integrity.h"

namespace kvferry::pd {
namespace detail {
namespace {
constexpr auto kBootstrapRetry = std::chrono::milliseconds(50);
// A silent bootstrap server is polled at most every 2^kMaxHealthMisses heartbeat intervals.
constexpr int kMaxHealthMisses = 4;

std::string rank_name(const PrefillInstance& inst, uint32_t rank) {
  return "prefill tp " + std::to_string(rank) + " of " + inst.bootstrap_address;
}

// A timeout keeps the code of the error that kept the request waiting (PeerUnreachable,
// FailedPrecondition: not every rank registered, ...) and says that it timed out; with no
// such error (an attempt still hanging) it is a plain Timeout.
Status timed_out(const std::string& what, std::chrono::milliseconds after,
                 const Status& last_error) {
  std::string message = what + " after " + std::to_string(after.count()) + " ms";
  if (last_error.ok()) return Timeout(message);
  return Status(last_error.code(), message + "; last error: " + last_error.message());
}
}  // namespace

DecodeClientImpl::DecodeClientImpl(DecodeClientOptions options)
    : options_(std::move(options)),
      engine_(*options_.engine),
      metrics_(options_.metrics ? std::make_unique<PdMetrics>("decode") : nullptr) {}

Status DecodeClientImpl::start() {
  KVF_RETURN_IF_ERROR(kv::validate_tp_pair({1, 0, options_.tp.size, options_.tp.rank}));
  if (options_.buffers.layout.num_entries() == 0) {
    return InvalidArgument("decode client: the KV layout has no entries");
  }
  bootstrap_pool_ = std::make_unique<ThreadPool>(std::max(1, options_.bootstrap_threads),
                                                 "kvf-pd-boot", ThreadPool::Start::kOnDemand);
  KVF_ASSIGN_OR_RETURN(monitor_thread_,
                       start_named_thread("kvf-pd-decode", [this] { monitor_loop(); }));
  return Status::Ok();
}

DecodeClientImpl::~DecodeClientImpl() {
  stopping_ = true;
  if (monitor_thread_.joinable()) monitor_thread_.join();
  bootstrap_pool_.reset();
  // No channel is started now (the bootstrap pool and the monitor have stopped).
  std::vector<std::shared_ptr<ControlChannel>> channels;
  {
    std::lock_guard lock(mu_);
    for (const auto& weak : channels_) {
      if (auto channel = weak.lock()) channels.push_back(std::move(channel));
    }
  }
  for (auto& channel : channels) channel->close();
}

bool DecodeClientImpl::replicated() const {
  for (const kv::KvEntry& e : options_.buffers.layout.entries()) {
    if (e.role == kv::KvRole::kKey || e.role == kv::KvRole::kValue) return false;
  }
  return true;
}

RegisterLayout DecodeClientImpl::registration() const {
  RegisterLayout reg;
  reg.tp_rank = options_.tp.rank;
  reg.tp_size = options_.tp.size;
  reg.total_kv_heads = options_.tp.total_kv_heads;
  reg.engine_endpoint = engine_.endpoint();
  reg.incarnation = engine_.incarnation();
  reg.info = options_.buffers.layout.info();
  reg.entries.assign(options_.buffers.layout.entries().begin(),
                     options_.buffers.layout.entries().end());
  reg.aux = options_.buffers.aux;
  reg.state = options_.buffers.state;
  return reg;
}

Result<KvReceiver> DecodeClientImpl::create_receiver(const std::string& bootstrap_address,
                                                     uint64_t room) {
  KVF_RETURN_IF_ERROR(parse_endpoint(bootstrap_address).status());
  std::shared_ptr<ReceiverState> r;
  bool connect = false;
  std::shared_ptr<PrefillInstance> inst;
  {
    std::lock_guard lock(mu_);
    auto existing = rooms_.find(room);
    if (existing != rooms_.end()) {
      return AlreadyExists("decode: a receiver for room " + std::to_string(room) + " exists");
    }
    auto& slot = instances_[bootstrap_address];
    if (!slot || slot->phase == PrefillInstance::Phase::kDead) {
      slot = std::make_shared<PrefillInstance>();
      slot->bootstrap_address = bootstrap_address;
      connect = true;
    }
    inst = slot;
    r = std::make_shared<ReceiverState>(room, this, inst);
    rooms_[room] = r;
    if (inst->phase == PrefillInstance::Phase::kReady)
      r->cell.advance(RequestState::kWaitingForInput);
  }
  if (connect) {
    Status posted = bootstrap_pool_->post([this, inst] { connect_instance(inst); });
    if (!posted.ok()) kill_instance(inst, posted);  // no thread to connect: its rooms fail
  }
  return KvReceiver(r);
}

void DecodeClientImpl::connect_instance(const std::shared_ptr<PrefillInstance>& inst) {
  Status s = stopping_ ? Cancelled("decode client is stopping") : connect_links(inst);
  std::vector<std::shared_ptr<ReceiverState>> waiting;
  {
    std::lock_guard lock(mu_);
    if (s.ok() && inst->phase == PrefillInstance::Phase::kConnecting) {
      inst->phase = PrefillInstance::Phase::kReady;
      inst->last_healthy = Clock::now();
    } else if (s.ok()) {
      s = inst->error;  // a link died while the others were connecting
    }
    for (auto& [room, r] : rooms_) {
      if (r->instance == inst) waiting.push_back(r);
    }
  }
  if (!s.ok()) {
    log().warn("decode: cannot reach prefill instance {}: {}", inst->bootstrap_address,
               s.to_string());
    kill_instance(inst, s);
    return;
  }
  log().info("decode tp {}: connected to prefill instance {} (tp {}, reading ranks {}..{})",
             options_.tp.rank, inst->bootstrap_address, inst->layout.tp_size, inst->ranks.front(),
             inst->ranks.back());
  for (auto& r : waiting) {
    if (r->cell.advance(RequestState::kWaitingForInput)) dispatch(r);
  }
}

Status DecodeClientImpl::connect_links(const std::shared_ptr<PrefillInstance>& inst) {
  const auto deadline = Clock::now() + options_.timeouts.bootstrap_timeout;
  BootstrapClient bootstrap(
      inst->bootstrap_address,
      std::max(std::chrono::milliseconds(200), options_.timeouts.heartbeat_interval),
      engine_.secret());
  auto retryable = [](const Status& s) {
    return s.code() == StatusCode::kFailedPrecondition || s.code() == StatusCode::kPeerUnreachable;
  };
  Result<InstanceLayout> layout = bootstrap.layout();
  for (;;) {
    {
      std::lock_guard lock(mu_);
      inst->last_attempt_error = layout.status();  // OK again once the layout came
    }
    if (layout.ok()) break;
    if (!retryable(layout.status()) || stopping_) return layout.status();
    if (Clock::now() >= deadline) {
      return timed_out("prefill instance " + inst->bootstrap_address + " not ready",
                       options_.timeouts.bootstrap_timeout, layout.status());
    }
    std::this_thread::sleep_for(kBootstrapRetry);
    layout = bootstrap.layout();
  }
  KVF_ASSIGN_OR_RETURN(
      std::vector<uint32_t> ranks,
      kv::prefill_ranks_for_decode_rank(layout->tp_size, options_.tp.size, options_.tp.rank));
  inst->layout = *layout;
  inst->ranks = ranks;
  for (uint32_t rank : ranks) {
    KVF_ASSIGN_OR_RETURN(auto link, connect_link(inst, bootstrap, rank, deadline));
    std::lock_guard lock(mu_);
    inst->links[rank] = link;
  }
  return Status::Ok();
}

Result<std::shared_ptr<PrefillLink>> DecodeClientImpl::connect_link(
    const std::shared_ptr<PrefillInstance>& inst, const BootstrapClient& bootstrap,
    uint32_t prefill_rank, Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(RankRegistration reg, bootstrap.rank(prefill_rank));
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(reg.control_endpoint));
  KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(endpoint, deadline));
  KVF_RETURN_IF_ERROR(answer_control_challenge(fd.get(), engine_.secret(),
                                               rank_name(*inst, prefill_rank), deadline));
  auto link = std::make_shared<PrefillLink>();
  link->prefill_rank = prefill_rank;
  std::weak_ptr<PrefillInstance> weak_inst = inst;
  std::weak_ptr<PrefillLink> weak_link = link;
  link->channel = ControlChannel::open(
      std::move(fd), rank_name(*inst, prefill_rank),
      [this, weak_inst, weak_link, prefill_rank](ControlMessage&& m) {
        auto l = weak_link.lock();
        if (auto* reply = std::get_if<RegisterReply>(&m); reply != nullptr && l) {
          if (reply->code == StatusCode::kOk) {
            l->channel->limit_payload_bytes(kMaxControlPayloadBytes);
          }
          std::lock_guard lock(l->mu);
          l->reply = *reply;
          l->cv.notify_all();
          return;
        }
        if (auto i = weak_inst.lock()) on_message(i, prefill_rank, std::move(m));
      },
      [this, weak_inst, weak_link, prefill_rank](const Status& reason) {
        bool accepted = false;
        if (auto l = weak_link.lock()) {
          l->alive = false;
          std::lock_guard lock(l->mu);
          accepted = l->reply && l->reply->code == StatusCode::kOk;
          l->cv.notify_all();
        }
        // A registration prefill refused (e.g. Unauthenticated) is reported by connect_link
        // with its own code; only an accepted link's loss fails the instance.
        if (!accepted) return;
        if (auto i = weak_inst.lock()) on_link_lost(i, prefill_rank, reason);
      });
  {
    std::lock_guard lock(mu_);
    std::erase_if(channels_, [](const std::weak_ptr<ControlChannel>& c) { return c.expired(); });
    channels_.push_back(link->channel);
  }
  // Until prefill accepted the registration, it may send no more than its RegisterReply.
  link->channel->limit_payload_bytes(max_reply_payload_bytes());
  link->channel->start({options_.timeouts, engine_.incarnation()}, control_hub_);
  // A send that fails because prefill refused us and closed still gets its reply (the reader
  // hands it over before it sees the end of the stream).
  Status sent = link->channel->send(registration());
  std::optional<RegisterReply> reply;
  {
    std::unique_lock lock(link->mu);
    link->cv.wait_until(lock, deadline, [&] { return link->reply.has_value() || !link->alive; });
    reply = link->reply;
  }
  // close() joins the channel's reader, whose on_close takes link->mu: never with it held
  // (a registration that timed out on a lossy link deadlocked both bootstrap threads, and
  // every later request to any prefill instance stayed Bootstrapping).
  if (!reply) {
    link->channel->close();
    if (!sent.ok()) return sent;
    return PeerUnreachable(rank_name(*inst, prefill_rank) + " did not accept the registration");
  }
  if (reply->code != StatusCode::kOk) {
    link->channel->close();
    return Status(reply->code,
                  rank_name(*inst, prefill_rank) + " refused the layout: " + reply->reason);
  }
  return link;
}

void DecodeClientImpl::on_message(const std::shared_ptr<PrefillInstance>& inst, uint32_t rank,
                                  ControlMessage&& message) {
  if (std::holds_alternative<Heartbeat>(message)) return;
  if (auto* status = std::get_if<RequestStatusMessage>(&message)) {
    auto r = find_room(status->room);
    if (!r || r->instance != inst) return;  // finished or unknown: nothing to do
    if (status->state == RequestState::kSuccess) {
      if (Status bad = verify_rank(r, rank, *status); !bad.ok()) {
        fail(r, bad);
        settle(r);
        return;
      }
      bool all = false;
      {
        std::lock_guard lock(r->mu);
        r->pending_ranks.erase(rank);
        all = r->sent && r->pending_ranks.empty();
        if (all) r->transfer_end = Clock::now();
      }
      if (all) r->cell.advance(RequestState::kSuccess);
    } else if (status->state == RequestState::kFailed) {
      fail(r, Status(status->code, rank_name(*inst, rank) + ": " + status->reason));
    }
    settle(r);
    return;
  }
  // A room is touched only by the prefill instance it was sent to.
  if (auto* ack = std::get_if<AbortAck>(&message)) {
    if (auto r = find_room(ack->room); r && r->instance == inst) {
      {
        std::lock_guard lock(r->mu);
        r->ack_pending_ranks.erase(rank);
        r->ack_cv.notify_all();
      }
      settle(r);
    }
    return;
  }
  if (auto* abort = std::get_if<AbortMessage>(&message)) {
    if (auto r = find_room(abort->room); r && r->instance == inst) {
      fail(r, Cancelled(rank_name(*inst, rank) + " aborted the request: " + abort->reason));
      settle(r);
    }
    return;
  }
  log().warn("decode: {} sent unexpected {}", rank_name(*inst, rank),
             message_type_name(message_type(message)));
}

Status DecodeClientImpl::verify_rank(const std::shared_ptr<ReceiverState>& r, uint32_t rank,
                                     const RequestStatusMessage& status) {
  if (!options_.integrity.enabled) return Status::Ok();
  std::vector<kv::PageIndex> pages;
  {
    std::lock_guard lock(r->mu);
    // Replicated MLA: only the first prefill rank writes; the others resolve without data.
    if (replicated() && rank != r->instance->ranks.front()) return Status::Ok();
    pages = r->input.dst_pages;
  }
  const std::string who =
      "room " + std::to_string(r->room) + " from " + rank_name(*r->instance, rank);
  if (!status.integrity) {
    return FailedPrecondition(who +
                              ": Success without page digests, but decode runs with integrity "
                              "enabled (enable it on prefill too)");
  }
  if (options_.before_verify_for_test) options_.before_verify_for_test(r->room, rank);
  return verify_pages(*status.integrity, options_.buffers.layout, pages, who);
}

void DecodeClientImpl::on_link_lost(const std::shared_ptr<PrefillInstance>& inst, uint32_t rank,
                                    const Status& reason) {
  if (stopping_) return;
  kill_instance(inst, PeerDisconnected(rank_name(*inst, rank) + " lost: " + reason.message()));
}

void DecodeClientImpl::kill_instance(const std::shared_ptr<PrefillInstance>& inst,
                                     const Status& reason) {
  std::vector<std::shared_ptr<ReceiverState>> affected;
  std::vector<std::shared_ptr<PrefillLink>> links;
  // What the requests fail with: the first reason the instance died for, not what its
  // death caused (closing its links below reports each lost, on this thread or another).
  Status why;
  bool first = false;
  {
    std::lock_guard lock(mu_);
    if (inst->phase != PrefillInstance::Phase::kDead) {
      inst->phase = PrefillInstance::Phase::kDead;
      inst->error = reason;
      first = true;
    }
    why = inst->error;
    for (auto& [rank, link] : inst->links) links.push_back(link);
    for (auto& [room, r] : rooms_) {
      if (r->instance == inst) affected.push_back(r);
    }
  }
  if (first && !affected.empty()) {
    log().warn("decode: prefill instance {} failed: {} ({} requests fail)", inst->bootstrap_address,
               why.message(), affected.size());
  }
  for (auto& link : links) link->channel->close();
  // No ack will come over a lost link, but writes already on their way may still land (a
  // hung or partitioned prefill resumes them): the pages wait until every engine call of
  // the prefill that may carry them has timed out (its transfer_call_timeout, configured
  // like ours), and a heartbeat timeout more.
  const auto fence = Clock::now() + options_.timeouts.transfer_call_timeout +
                     options_.timeouts.effective_heartbeat_timeout();
  for (auto& r : affected) {
    // The fence is in place before the failure is visible: a caller woken by the Failed
    // state may ask wait_abort_acked at once, and must not get its pages back early.
    {
      std::lock_guard lock(r->mu);
      if (r->sent) r->fenced_until = fence;
    }
    fail(r, why);
    {
      std::lock_guard lock(r->mu);
      // A request that succeeded before the link went has nothing more on its way.
      if (r->cell.state() != RequestState::kFailed) r->fenced_until = {};
      r->ack_pending_ranks.clear();
      r->ack_cv.notify_all();
    }
    settle(r);
  }
}

std::shared_ptr<ReceiverState> DecodeClientImpl::find_room(uint64_t room) const {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  return it == rooms_.end() ? nullptr : it->second;
}

void DecodeClientImpl::poll_health(const std::shared_ptr<PrefillInstance>& inst,
                                   Clock::time_point now) {
  if (inst->health_polling.load(std::memory_order_acquire) || now < inst->next_health_poll) {
    return;
  }
  inst->health_polling.store(true, std::memory_order_relaxed);
  Status posted = bootstrap_pool_->post([this, inst] {
    check_health(inst);
    inst->health_polling.store(false, std::memory_order_release);
  });
  if (!posted.ok()) {
    inst->health_polling.store(false, std::memory_order_relaxed);
    health_log_.warn("decode: no /health poll of bootstrap server {}: {}", inst->bootstrap_address,
                     posted.message());
  }
}

// What the bootstrap server reports is information: a rank it reports with another
// incarnation restarted, one it reports stale stopped heartbeating, and either fails the
// instance. Silence is not: the bootstrap server is needed to start a request, not to finish
// one, and a flood or a restart of it says nothing about the prefill ranks. Their liveness is
// their control links' (heartbeats and the silence check close a dead link, and
// on_link_lost fails the instance), so an unreachable bootstrap server fails nothing, and is
// asked less often the longer it stays silent: each poll of a server that does not answer can
// hold a bootstrap thread for its timeout, which new instances' connections wait behind.
void DecodeClientImpl::check_health(const std::shared_ptr<PrefillInstance>& inst) {
  BootstrapClient bootstrap(
      inst->bootstrap_address,
      std::max(std::chrono::milliseconds(50), options_.timeouts.heartbeat_interval / 2),
      engine_.secret());
  Result<HealthReport> health = bootstrap.health();
  if (metrics_ != nullptr) metrics_->on_bootstrap(health.status());
  const auto now = Clock::now();
  if (!health.ok()) {
    inst->health_misses = std::min(inst->health_misses + 1, kMaxHealthMisses);
    inst->next_health_poll =
        now + options_.timeouts.heartbeat_interval * (1 << inst->health_misses);
    const auto silent_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(now - inst->last_healthy).count();
    health_log_.warn(
        "decode: no health report from bootstrap server {} for {} ms ({}); requests in flight "
        "go on over their control links",
        inst->bootstrap_address, silent_ms, health.status().message());
    return;
  }
  for (const RankHealth& rank : health->ranks) {
    auto it = inst->links.find(rank.tp_rank);
    if (it == inst->links.end() || !it->second->reply) continue;
    if (rank.incarnation != it->second->reply->incarnation) {
      return kill_instance(inst, PeerDisconnected(rank_name(*inst, rank.tp_rank) +
                                                  " restarted (bootstrap reports a new "
                                                  "incarnation)"));
    }
    if (!rank.alive) {
      return kill_instance(inst, PeerDisconnected(rank_name(*inst, rank.tp_rank) +
                                                  " stopped heartbeating the bootstrap server"));
    }
  }
  inst->last_healthy = now;
  inst->health_misses = 0;
  inst->next_health_poll = {};
}

void DecodeClientImpl::monitor_loop() {
  const PdTimeouts& t = options_.timeouts;
  Clock::time_point next_beat = Clock::now();
  while (!stopping_) {
    std::this_thread::sleep_for(t.tick());
    const auto now = Clock::now();
    // The instances a request in flight waits on: only their health can fail one.
    std::vector<std::shared_ptr<PrefillInstance>> busy;
    std::vector<std::shared_ptr<ReceiverState>> receivers;
    {
      std::lock_guard lock(mu_);
      for (auto& [room, r] : rooms_) {
        receivers.push_back(r);
        const RequestState state = r->cell.state();
        if (state != RequestState::kSuccess && state != RequestState::kFailed &&
            r->instance->phase == PrefillInstance::Phase::kReady) {
          busy.push_back(r->instance);
        }
      }
    }
    std::sort(busy.begin(), busy.end());
    busy.erase(std::unique(busy.begin(), busy.end()), busy.end());
    for (auto& r : receivers) {
      RequestState state = r->cell.state();
      if (state == RequestState::kBootstrapping && now - r->created > t.bootstrap_timeout) {
        Status last_error;
        {
          std::lock_guard lock(mu_);
          last_error = r->instance->last_attempt_error;
        }
        fail(r, timed_out("room " + std::to_string(r->room) + " still Bootstrapping",
                          t.bootstrap_timeout, last_error));
        settle(r);
      } else if (state == RequestState::kTransferring) {
        Clock::time_point start;
        {
          std::lock_guard lock(r->mu);
          start = r->transfer_start;
        }
        if (now - start > t.waiting_timeout) {
          abort(r, Timeout("room " + std::to_string(r->room) + " still Transferring after " +
                           std::to_string(t.waiting_timeout.count()) + " ms"));
        }
      }
    }
    // Heartbeats and the silence check on each control link are the channel's own
    // (ControlChannel: a silent link closes, and on_link_lost fails the instance); what
    // beats here is the bootstrap server's health report, asked of the instances with a
    // request in flight, off this thread (a server that does not answer holds a pool
    // thread for its timeout, never the timeouts above).
    if (now >= next_beat) {
      next_beat = now + t.heartbeat_interval;
      for (auto& inst : busy) poll_health(inst, now);
    }
  }
}

MetricsSnapshot DecodeClientImpl::metrics() const {
  return metrics_ == nullptr ? MetricsSnapshot{} : metrics_->snapshot(engine_.endpoint());
}

DecodeStats DecodeClientImpl::stats() const {
  std::lock_guard lock(mu_);
  DecodeStats s = stats_;
  for (auto& [addr, inst] : instances_) {
    if (inst->phase == PrefillInstance::Phase::kReady) {
      s.prefill_connections += static_cast<uint32_t>(inst->links.size());
    }
  }
  return s;
}

}  // namespace detail

Result<std::unique_ptr<DecodeClient>> DecodeClient::create(DecodeClientOptions options) {
  if (options.engine == nullptr) return InvalidArgument("decode client: engine is null");
  KVF_RETURN_IF_ERROR(options.integrity.check("decode client"));
  auto impl = std::make_unique<detail::DecodeClientImpl>(std::move(options));
  KVF_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<DecodeClient>(new DecodeClient(std::move(impl)));
}

DecodeClient::DecodeClient(std::unique_ptr<detail::DecodeClientImpl> impl)
    : impl_(std::move(impl)) {}
DecodeClient::~DecodeClient() = default;
Result<KvReceiver> DecodeClient::create_receiver(const std::string& bootstrap_address,
                                                 uint64_t room) {
  return impl_->create_receiver(bootstrap_address, room);
}
DecodeStats DecodeClient::stats() const { return impl_->stats(); }
MetricsSnapshot DecodeClient::metrics() const { return impl_->metrics(); }

}  // namespace kvferry::pd
