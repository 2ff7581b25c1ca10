// PrefillServer: control listener, decode peers, message handling, heartbeats and timeouts.
// The send path is in kv_sender.cc.
#include "kvferry/pd/prefill_server.h"

#include <fmt/format.h>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "core/logging.h"
#include "core/named_thread.h"
#include "kvferry/kv/tp_slice.h"
#include "kvferry/pd/bootstrap.h"
#include "pd/control_auth.h"
#include "pd/prefill_state.h"

namespace kvferry::pd {
namespace detail {
namespace {

// After this many connections closed unregistered (a burst of clients that never registered,
// each with a frame of up to the registration cap buffered), freed memory goes back to the
// system, at most once per interval: glibc keeps what threads freed in their arenas, so a
// burst would otherwise leave its peak resident for good.
constexpr uint32_t kTrimAfterUnregisteredCloses = 16;
constexpr auto kTrimInterval = std::chrono::seconds(1);

void give_freed_memory_back() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace

PrefillServerImpl::PrefillServerImpl(PrefillServerOptions options)
    : options_(std::move(options)),
      engine_(*options_.engine),
      metrics_(options_.metrics ? std::make_unique<PdMetrics>("prefill") : nullptr) {}

Status PrefillServerImpl::start() {
  KVF_RETURN_IF_ERROR(kv::validate_tp_pair({options_.tp.size, options_.tp.rank, 1, 0}));
  if (options_.buffers.layout.num_entries() == 0) {
    return InvalidArgument("prefill server: the KV layout has no entries");
  }
  if (options_.worker_shards <= 0) {
    return InvalidArgument("prefill server: worker_shards " +
                           std::to_string(options_.worker_shards) + " (need > 0)");
  }
  KVF_ASSIGN_OR_RETURN(Endpoint listen, parse_endpoint(options_.control_listen, true));
  registration_payload_limit_ = max_registration_payload_bytes(options_.buffers);
  KVF_ASSIGN_OR_RETURN(
      acceptor_,
      Acceptor::bind(listen, Acceptor::Options::named("pd control", 0, options_.control_limits)));
  control_endpoint_ = acceptor_->endpoint().to_string();
  for (int i = 0; i < options_.worker_shards; ++i) {
    shards_.push_back(std::make_unique<ThreadPool>(1, "kvf-pd-s" + std::to_string(i),
                                                   ThreadPool::Start::kOnDemand));
  }
  // Accepting before registering: the bootstrap server may ask this control listener for
  // the incarnation it greets with before it lets a new incarnation take the rank over (a
  // restart on the same port).
  KVF_RETURN_IF_ERROR(acceptor_->start(
      [this](Fd fd, ConnectionSlot slot) { on_accepted(std::move(fd), std::move(slot)); }));
  if (!options_.bootstrap_address.empty()) {
    KVF_RETURN_IF_ERROR(register_at_start());
    KVF_ASSIGN_OR_RETURN(registration_, PeriodicTask::start(
                                            options_.timeouts.heartbeat_interval,
                                            [this] {
                                              Status s = register_with_bootstrap();
                                              if (!s.ok()) {
                                                log().debug("prefill: bootstrap heartbeat: {}",
                                                            s.to_string());
                                              }
                                            },
                                            "kvf-pd-register"));
  }
  KVF_ASSIGN_OR_RETURN(monitor_thread_,
                       start_named_thread("kvf-pd-prefill", [this] { monitor_loop(); }));
  return Status::Ok();
}

PrefillServerImpl::~PrefillServerImpl() {
  stopping_ = true;
  registration_.reset();  // waits for a registration under way
  if (acceptor_) acceptor_->stop();
  if (monitor_thread_.joinable()) monitor_thread_.join();
  // The acceptor has stopped, so no channel is added now. Closing joins each reader, also
  // of channels whose peer on_close already dropped (a reader may still be inside
  // on_close, which uses this object).
  std::vector<std::shared_ptr<ControlChannel>> channels;
  {
    std::lock_guard lock(mu_);
    for (const auto& weak : channels_) {
      if (auto channel = weak.lock()) channels.push_back(std::move(channel));
    }
  }
  for (auto& channel : channels) channel->close();
  shards_.clear();  // runs what is queued (tasks see stopping_) and joins
}

Status PrefillServerImpl::register_with_bootstrap() {
  RankRegistration r;
  r.tp_rank = options_.tp.rank;
  r.tp_size = options_.tp.size;
  r.control_endpoint = control_endpoint_;
  r.engine_endpoint = engine_.endpoint();
  r.incarnation = engine_.incarnation();
  r.page_size_tokens = options_.buffers.layout.info().page_size_tokens;
  r.dtype_bytes = options_.buffers.layout.info().dtype_bytes;
  // A registration that changes the rank waits for the server's probe of the old one.
  BootstrapClient client(options_.bootstrap_address,
                         std::max(kRankProbeTimeout + std::chrono::milliseconds(500),
                                  options_.timeouts.heartbeat_interval),
                         engine_.secret());
  Status result = client.register_rank(r);
  if (metrics_ != nullptr) metrics_->on_bootstrap(result);
  return result;
}

// A prefill that starts before its bootstrap server answers, or right after a predecessor of
// its rank was killed (the server holds that rank live until it goes stale, or until its
// control port refuses the server's probe), waits for it: the registration is retried with
// backoff for up to bootstrap_timeout. A refusal that waiting cannot change (a malformed
// registration, a wrong secret, a reply that does not parse) fails at once; the last error
// is returned at the deadline.
Status PrefillServerImpl::register_at_start() {
  const auto deadline = Clock::now() + options_.timeouts.bootstrap_timeout;
  auto pause = std::chrono::milliseconds(50);
  for (;;) {
    Status s = register_with_bootstrap();
    const StatusCode c = s.code();
    const bool may_pass = c == StatusCode::kPeerUnreachable || c == StatusCode::kPeerDisconnected ||
                          c == StatusCode::kTimeout || c == StatusCode::kAlreadyExists ||
                          c == StatusCode::kFailedPrecondition;
    if (s.ok() || !may_pass || Clock::now() + pause >= deadline) return s;
    log().warn(
        "prefill tp {}: {}; retrying for up to {} ms", options_.tp.rank, s.to_string(),
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2,
                     std::max(std::chrono::milliseconds(50), options_.timeouts.heartbeat_interval));
  }
}

Result<KvSender> PrefillServerImpl::create_sender(uint64_t room) {
  std::lock_guard lock(mu_);
  auto& slot = rooms_[room];
  if (!slot) slot = std::make_shared<SenderState>(room, this);
  std::lock_guard slock(slot->mu);
  if (slot->claimed) {
    return AlreadyExists("prefill: a sender for room " + std::to_string(room) + " exists");
  }
  slot->claimed = true;
  return KvSender(slot);
}

MetricsSnapshot PrefillServerImpl::metrics() const {
  return metrics_ == nullptr ? MetricsSnapshot{} : metrics_->snapshot(control_endpoint_);
}

PrefillStats PrefillServerImpl::stats() const {
  std::lock_guard lock(mu_);
  PrefillStats s = stats_;
  s.decode_connections = static_cast<uint32_t>(peers_.size());
  s.open_rooms = rooms_.size();
  return s;
}

void PrefillServerImpl::on_accepted(Fd fd, ConnectionSlot slot) {
  std::shared_ptr<DecodePeer> peer;
  {
    std::lock_guard lock(mu_);
    peer = std::make_shared<DecodePeer>(next_peer_id_++);
  }
  peer->slot = std::move(slot);
  // Callbacks hold the peer weakly: the channel must not keep its own owner alive.
  std::weak_ptr<DecodePeer> weak = peer;
  peer->channel = ControlChannel::open(
      std::move(fd), peer->name(),
      [this, weak](ControlMessage&& m) {
        if (auto self = weak.lock()) on_message(self, std::move(m));
      },
      [this, weak](const Status& reason) {
        if (auto self = weak.lock()) on_close(self, reason);
      });
  // The challenge goes first, before a heartbeat can be sent (a few bytes into a fresh
  // socket's buffer: this does not wait on the peer).
  Result<AuthChallengeMessage> challenge =
      make_control_challenge(engine_.secret(), engine_.incarnation());
  if (!challenge.ok() || !peer->channel->send(*challenge).ok()) {
    warnings_.refused.warn("prefill: cannot challenge {}: {}", peer->name(),
                           challenge.ok() ? "send failed" : challenge.status().to_string());
    return;  // the channel (and its socket) goes with `peer`; no thread was started
  }
  peer->challenge = std::move(*challenge);
  peer->authenticated = !engine_.secret().has_value();
  // Until it proved the secret, or registered, the connection may send no more than the
  // frame it owes next: its buffers stay a few kilobytes whatever its headers claim.
  peer->channel->limit_payload_bytes(peer->authenticated ? registration_payload_limit_
                                                         : max_proof_payload_bytes());
  // Published (channel set, peer listed) before the first callback can use either.
  {
    std::lock_guard lock(mu_);
    peers_[peer->id] = peer;
    std::erase_if(channels_, [](const std::weak_ptr<ControlChannel>& c) { return c.expired(); });
    channels_.push_back(peer->channel);
  }
  peer->channel->start({options_.timeouts, engine_.incarnation()}, control_hub_);
}

bool PrefillServerImpl::authenticate(const std::shared_ptr<DecodePeer>& peer,
                                     const ControlMessage& message) {
  if (peer->authenticated) return true;
  const auto* proof = std::get_if<AuthProofMessage>(&message);
  if (proof != nullptr && control_proof_matches(*engine_.secret(), peer->challenge, *proof)) {
    peer->authenticated = true;
    peer->channel->limit_payload_bytes(registration_payload_limit_);
    return false;  // consumed
  }
  Status why =
      Unauthenticated(proof != nullptr ? "wrong secret"
                                       : std::string(message_type_name(message_type(message))) +
                                             " before the AuthProof of the secret");
  warnings_.refused.warn("prefill: refused {}: {}", peer->name(), why.message());
  peer->channel
      ->send(RegisterReply{options_.tp.rank, engine_.incarnation(), why.code(), why.message()})
      .ignore();
  peer->channel->close();
  return false;
}

void PrefillServerImpl::on_message(const std::shared_ptr<DecodePeer>& peer,
                                   ControlMessage&& message) {
  if (!authenticate(peer, message)) return;
  if (auto* reg = std::get_if<RegisterLayout>(&message)) return on_register(peer, std::move(*reg));
  if (auto* req = std::get_if<TransferRequest>(&message)) return on_request(peer, std::move(*req));
  if (auto* abort = std::get_if<AbortMessage>(&message)) return on_abort(peer, *abort);
  if (std::holds_alternative<Heartbeat>(message)) return;
  warnings_.requests.warn("prefill: {} sent unexpected {}", peer->name(),
                          message_type_name(message_type(message)));
}

void PrefillServerImpl::on_register(const std::shared_ptr<DecodePeer>& peer, RegisterLayout&& reg) {
  RegisterReply reply{options_.tp.rank, engine_.incarnation(), StatusCode::kOk, ""};
  auto refuse = [&](const Status& why) {
    warnings_.refused.warn("prefill: refused registration from {}: {}", peer->name(),
                           why.to_string());
    reply.code = why.code();
    reply.reason = why.message();
    peer->channel->send(reply).ignore();
  };
  if (peer->registered) return refuse(FailedPrecondition("already registered on this connection"));
  Result<kv::KvLayout> layout = kv::KvLayout::create(reg.info, reg.entries);
  if (!layout.ok()) return refuse(layout.status());
  if (layout->num_entries() != options_.buffers.layout.num_entries()) {
    return refuse(InvalidArgument("decode layout has " + std::to_string(layout->num_entries()) +
                                  " entries, prefill has " +
                                  std::to_string(options_.buffers.layout.num_entries())));
  }
  Status tp = kv::validate_tp_pair({options_.tp.size, options_.tp.rank, reg.tp_size, reg.tp_rank});
  if (!tp.ok()) return refuse(tp);
  Result<PeerHandle> engine_peer = engine_.open_peer(reg.engine_endpoint);
  if (!engine_peer.ok()) return refuse(engine_peer.status());
  peer->rename("decode tp " + std::to_string(reg.tp_rank) + "/" + std::to_string(reg.tp_size) +
               " @ " + reg.engine_endpoint);
  peer->layout = std::move(*layout);
  peer->engine_peer = *engine_peer;
  peer->registration = std::move(reg);
  peer->registered = true;
  peer->channel->limit_payload_bytes(kMaxControlPayloadBytes);
  log().info("prefill tp {}: registered {} over {}", options_.tp.rank, peer->name(),
             transport_kind_name(peer->engine_peer.transport()));
  peer->channel->send(reply).ignore();
}

Status PrefillServerImpl::admit_destination(const SenderState& s, const DecodePeer& peer,
                                            const TransferRequest& request) const {
  const std::string room = "room " + std::to_string(s.room);
  const RegisterLayout& reg = peer.registration;
  for (const Destination& d : s.dsts) {
    if (d.peer.get() == &peer) {
      return AlreadyExists(room + ": " + peer.name() +
                           " already sent its TransferRequest for it on this connection");
    }
  }
  if (s.required != 0 && request.required_dst_ranks != s.required) {
    return InvalidArgument(room + ": required_dst_ranks " +
                           std::to_string(request.required_dst_ranks) + " differs from " +
                           std::to_string(s.required) + " of its destinations");
  }
  if (s.required != 0 && s.dsts.size() >= s.required) {
    return AlreadyExists(room + " already has all " + std::to_string(s.required) +
                         " of its destinations: " + peer.name() + " is not a destination of it");
  }
  for (const Destination& d : s.dsts) {
    const RegisterLayout& other = d.peer->registration;
    if (other.tp_size != reg.tp_size) {
      return InvalidArgument(room + ": " + peer.name() + " has decode tp size " +
                             std::to_string(reg.tp_size) + ", its destinations have " +
                             std::to_string(other.tp_size));
    }
    if (other.tp_rank == reg.tp_rank) {
      return AlreadyExists(room + ": decode tp rank " + std::to_string(reg.tp_rank) +
                           " is already its destination (over another connection)");
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<SenderState>> PrefillServerImpl::room_for_request(
    const std::shared_ptr<DecodePeer>& peer, uint64_t room) {
  std::lock_guard lock(mu_);
  if (auto it = rooms_.find(room); it != rooms_.end()) return it->second;
  const uint32_t per_decode = options_.max_open_rooms_per_decode;
  if (per_decode != 0 && peer->rooms_opened >= per_decode) {
    return FailedPrecondition(
        fmt::format("room {}: {} already holds {} open rooms, the limit max_open_rooms_per_decode",
                    room, peer->name(), peer->rooms_opened));
  }
  const uint32_t in_all = options_.max_open_rooms;
  if (in_all != 0 && rooms_opened_by_decode_ >= in_all) {
    return FailedPrecondition(
        fmt::format("room {}: decode requests hold {} open rooms here, the limit max_open_rooms",
                    room, rooms_opened_by_decode_));
  }
  auto s = std::make_shared<SenderState>(room, this);
  s->opener = peer;
  ++peer->rooms_opened;
  ++rooms_opened_by_decode_;
  rooms_.emplace(room, s);
  return s;
}

void PrefillServerImpl::refuse_request(const std::shared_ptr<DecodePeer>& peer, uint64_t room,
                                       const Status& why) {
  // Refused for this sender only: the room belongs to the destinations that filled it, and a
  // request that does not fit (another connection that learnt the room id, a repeat, a
  // mismatching required_dst_ranks) must not fail it for them.
  warnings_.requests.warn("prefill: refused the TransferRequest for room {} from {}: {}", room,
                          peer->name(), why.to_string());
  send_status(peer, RequestStatusMessage{room, RequestState::kFailed, why.code(), why.message(),
                                         std::nullopt});
}

void PrefillServerImpl::on_request(const std::shared_ptr<DecodePeer>& peer,
                                   TransferRequest&& request) {
  const uint64_t room = request.room;
  if (!peer->registered) {
    send_status(peer,
                RequestStatusMessage{room, RequestState::kFailed, StatusCode::kFailedPrecondition,
                                     "TransferRequest before RegisterLayout", std::nullopt});
    return;
  }
  if (request.required_dst_ranks > peer->registration.tp_size) {
    // Checked before the room is looked up, so that a request that cannot be right does not
    // leave a room behind.
    return refuse_request(
        peer, room,
        InvalidArgument("room " + std::to_string(room) + ": required_dst_ranks " +
                        std::to_string(request.required_dst_ranks) + " exceeds the tp size " +
                        std::to_string(peer->registration.tp_size) + " of " + peer->name()));
  }
  const uint64_t capacity = peer->layout.num_pages();
  if (request.dst_pages.size() > capacity) {
    return refuse_request(
        peer, room,
        InvalidArgument(fmt::format("room {}: {} destination pages, but {} holds {} pages in all",
                                    room, request.dst_pages.size(), peer->name(), capacity)));
  }
  for (const kv::PageIndex page : request.dst_pages) {
    if (page >= capacity) {
      return refuse_request(
          peer, room,
          InvalidArgument(fmt::format("room {}: destination page {} lies past the {} pages of {}",
                                      room, page, capacity, peer->name())));
    }
  }
  Result<std::shared_ptr<SenderState>> opened = room_for_request(peer, room);
  if (!opened.ok()) return refuse_request(peer, room, opened.status());
  std::shared_ptr<SenderState> s = std::move(*opened);
  Status refused;
  bool complete = false;
  {
    std::lock_guard lock(s->mu);
    refused = admit_destination(*s, *peer, request);
    if (refused.ok()) {
      s->required = request.required_dst_ranks;
      s->dsts.push_back(Destination{peer, std::move(request), false, false, {}});
      complete = s->dsts.size() == s->required;
    }
  }
  if (!refused.ok()) return refuse_request(peer, room, refused);
  if (s->cell.state() == RequestState::kFailed) {
    finish_if_drained(s);  // e.g. aborted earlier: tell this destination too
  } else if (complete) {
    s->cell.advance(RequestState::kWaitingForInput);
  }
}

void PrefillServerImpl::on_abort(const std::shared_ptr<DecodePeer>& peer,
                                 const AbortMessage& abort) {
  std::shared_ptr<SenderState> s;
  {
    std::lock_guard lock(mu_);
    auto it = rooms_.find(abort.room);
    if (it != rooms_.end()) s = it->second;
  }
  bool owner = false;
  if (s) {
    std::lock_guard lock(s->mu);
    for (const Destination& d : s->dsts) owner = owner || d.peer == peer;
    if (owner) s->ack_to.push_back(peer);
  }
  if (!owner) {
    // Only a connection that sent a TransferRequest for the room may abort it: another
    // decode (or anyone who guessed the room) cannot cancel it. None of this connection's
    // writes are in flight for the room, which is all the AbortAck says.
    if (s) {
      warnings_.requests.warn(
          "prefill: refused the Abort of room {} from {}: not a destination of it", abort.room,
          peer->name());
    }
    send_status(peer, AbortAck{abort.room});
    return;
  }
  log().info("prefill: room {} aborted by {}: {}", abort.room, peer->name(), abort.reason);
  fail(s, Cancelled("room " + std::to_string(abort.room) + " aborted by " + peer->name() + ": " +
                    abort.reason));
  finish_if_drained(s);
}

void PrefillServerImpl::on_close(const std::shared_ptr<DecodePeer>& peer, const Status& reason) {
  peer->alive = false;
  std::vector<std::shared_ptr<SenderState>> affected;
  {
    std::lock_guard lock(mu_);
    peers_.erase(peer->id);
    for (auto& [room, s] : rooms_) {
      std::lock_guard slock(s->mu);
      for (const Destination& d : s->dsts) {
        if (d.peer == peer) affected.push_back(s);
      }
    }
  }
  if (!stopping_ && peer->registered) {
    log().warn("prefill tp {}: lost {}: {} ({} requests fail)", options_.tp.rank, peer->name(),
               reason.message(), affected.size());
  } else if (!stopping_) {
    ++unregistered_closed_;
    warnings_.unfinished.warn("prefill tp {}: lost {} before it registered: {}", options_.tp.rank,
                              peer->name(), reason.message());
  }
  for (auto& s : affected) {
    fail(s, PeerDisconnected(peer->name() + " disconnected: " + reason.message()));
    finish_if_drained(s);
  }
  if (peer->engine_peer.valid()) engine_.close_peer(peer->engine_peer);
}

void PrefillServerImpl::send_status(const std::shared_ptr<DecodePeer>& peer,
                                    const ControlMessage& message) {
  if (!peer->alive) return;
  Status s = peer->channel->send(message);
  if (!s.ok()) warnings_.requests.warn("prefill: cannot tell {}: {}", peer->name(), s.to_string());
}

void PrefillServerImpl::monitor_loop() {
  const PdTimeouts& t = options_.timeouts;
  while (!stopping_) {
    std::this_thread::sleep_for(t.tick());
    const auto now = Clock::now();
    std::vector<std::shared_ptr<SenderState>> stale;
    std::vector<std::shared_ptr<SenderState>> expired;
    std::vector<std::shared_ptr<DecodePeer>> unregistered;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, peer] : peers_) {
        if (!peer->registered && now - peer->accepted > options_.control_limits.hello_timeout) {
          unregistered.push_back(peer);
        }
      }
      for (auto& [room, s] : rooms_) {
        const RequestState state = s->cell.state();
        if (state == RequestState::kBootstrapping && now - s->created > t.bootstrap_timeout) {
          stale.push_back(s);
        } else if (state == RequestState::kFailed) {
          // A failed room is held while destinations it still misses may attach, to be told at
          // once; for one bootstrap timeout, then it goes. One that attaches later starts a
          // room of its own, which fails in turn (a registered decode naming rooms at will
          // cannot make them pile up).
          if (s->failed_seen == Clock::time_point{}) {
            s->failed_seen = now;
          } else if (now - s->failed_seen > t.bootstrap_timeout) {
            expired.push_back(s);
          }
        }
      }
    }
    for (auto& peer : unregistered) {  // closed outside mu_: on_close takes it
      warnings_.unfinished.warn("prefill tp {}: closing {}: no RegisterLayout within {} ms",
                                options_.tp.rank, peer->name(),
                                options_.control_limits.hello_timeout.count());
      peer->channel->close();
    }
    for (auto& s : stale) {
      fail(s, Timeout("room " + std::to_string(s->room) + " still Bootstrapping after " +
                      std::to_string(t.bootstrap_timeout.count()) + " ms"));
      finish_if_drained(s);
    }
    for (auto& s : expired) {
      {
        std::lock_guard lock(s->mu);
        if (s->inflight != 0 || !s->ack_to.empty()) continue;  // finish_if_drained ends it
      }
      forget_room(s->room, s.get());
    }
    if (unregistered_closed_ >= kTrimAfterUnregisteredCloses && now - last_trim_ >= kTrimInterval) {
      unregistered_closed_ = 0;
      last_trim_ = now;
      give_freed_memory_back();
    }
  }
}

void PrefillServerImpl::forget_room(uint64_t room, const SenderState* s) {
  std::lock_guard lock(mu_);
  auto it = rooms_.find(room);
  if (it != rooms_.end() && it->second.get() == s) {
    (s->cell.state() == RequestState::kSuccess ? stats_.requests_succeeded
                                               : stats_.requests_failed)++;
    if (metrics_ != nullptr) metrics_->on_final(s->cell.state());
    if (s->opener != nullptr) {
      --s->opener->rooms_opened;
      --rooms_opened_by_decode_;
    }
    rooms_.erase(it);
  }
}

}  // namespace detail

Result<std::unique_ptr<PrefillServer>> PrefillServer::create(PrefillServerOptions options) {
  if (options.engine == nullptr) return InvalidArgument("prefill server: engine is null");
  KVF_RETURN_IF_ERROR(options.integrity.check("prefill server"));
  auto impl = std::make_unique<detail::PrefillServerImpl>(std::move(options));
  KVF_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<PrefillServer>(new PrefillServer(std::move(impl)));
}

PrefillServer::PrefillServer(std::unique_ptr<detail::PrefillServerImpl> impl)
    : impl_(std::move(impl)) {}
PrefillServer::~PrefillServer() = default;
const std::string& PrefillServer::control_endpoint() const { return impl_->control_endpoint(); }
Result<KvSender> PrefillServer::create_sender(uint64_t room) { return impl_->create_sender(room); }
PrefillStats PrefillServer::stats() const { return impl_->stats(); }
MetricsSnapshot PrefillServer::metrics() const { return impl_->metrics(); }

}  // namespace kvferry::pd
