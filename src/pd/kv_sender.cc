// The prefill send path: KvSender, chunk planning, worker-queue execution, completion and
// failure reporting after drain.
#include <algorithm>

#include "core/logging.h"
#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/planner.h"
#include "kvferry/kv/slot_plan.h"
#include "kvferry/pd/prefill_server.h"
#include "pd/prefill_state.h"

namespace kvferry::pd {
namespace detail {
namespace {

// Head slicing is needed when TP differs and every entry is a K or V cache (MLA latents
// are replicated: a full copy).
bool needs_head_slicing(const kv::KvLayout& layout, uint32_t prefill_tp, uint32_t decode_tp) {
  if (prefill_tp == decode_tp) return false;
  return std::all_of(layout.entries().begin(), layout.entries().end(), [](const kv::KvEntry& e) {
    return e.role == kv::KvRole::kKey || e.role == kv::KvRole::kValue;
  });
}

}  // namespace

Result<kv::TransferPlan> PrefillServerImpl::plan_chunk(const Destination& dst,
                                                       std::span<const kv::PageIndex> pages,
                                                       uint64_t dst_offset) const {
  const DecodePeer& peer = *dst.peer;
  kv::PlanOptions po;
  po.strategy =
      options_.send.strategy.value_or(kv::default_send_strategy(peer.engine_peer.transport()));
  if (po.strategy == kv::SendStrategy::kIndexSharded) {
    po.max_pages_per_call = options_.send.max_pages_per_call;
  }
  std::span<const kv::PageIndex> dst_pages(dst.request.dst_pages.data() + dst_offset, pages.size());
  const kv::KvLayout& src = options_.buffers.layout;
  if (needs_head_slicing(src, options_.tp.size, peer.registration.tp_size)) {
    kv::TpPair tp{options_.tp.size, options_.tp.rank, peer.registration.tp_size,
                  peer.registration.tp_rank};
    uint32_t heads = options_.tp.total_kv_heads != 0 ? options_.tp.total_kv_heads
                                                     : peer.registration.total_kv_heads;
    return kv::build_head_sliced_plan(src, peer.layout, pages, dst_pages, tp, heads, po);
  }
  return kv::build_transfer_plan(src, peer.layout, pages, dst_pages, po);
}

Status PrefillServerImpl::plan_extras(const Destination& dst, const LastChunkExtras& last,
                                      std::vector<kv::TransferPlan>& plans) const {
  const RegisterLayout& reg = dst.peer->registration;
  const RankBuffers& mine = options_.buffers;
  if (last.aux_row != kNoSlot && dst.request.aux_row != kNoSlot && !mine.aux.empty()) {
    KVF_ASSIGN_OR_RETURN(kv::TransferPlan aux,
                         kv::build_aux_plan(mine.aux, reg.aux, last.aux_row, dst.request.aux_row));
    plans.push_back(std::move(aux));
  }
  if (last.state_slot != kNoSlot && dst.request.state_slot != kNoSlot && !mine.state.empty()) {
    kv::TpPair tp{options_.tp.size, options_.tp.rank, reg.tp_size, reg.tp_rank};
    KVF_ASSIGN_OR_RETURN(kv::TransferPlan state,
                         kv::build_mamba_state_plan(mine.state, reg.state, last.state_slot,
                                                    dst.request.state_slot, tp));
    plans.push_back(std::move(state));
  }
  return Status::Ok();
}

Status PrefillServerImpl::send_chunk(const std::shared_ptr<SenderState>& s,
                                     std::span<const kv::PageIndex> pages,
                                     const LastChunkExtras* last) {
  const std::string room = "room " + std::to_string(s->room);
  struct Work {
    std::shared_ptr<DecodePeer> peer;
    std::vector<kv::TransferPlan> plans;
  };
  std::vector<Work> work;
  {
    std::lock_guard lock(s->mu);
    RequestState state = s->cell.state();
    if (state == RequestState::kFailed) return s->cell.failure();
    if (state < RequestState::kWaitingForInput) {
      return FailedPrecondition(room + " is " + std::string(request_state_name(state)) +
                                "; send once it is WaitingForInput");
    }
    if (s->last_queued) return FailedPrecondition(room + ": the last chunk was already sent");
    for (const Destination& dst : s->dsts) {
      const uint64_t capacity = dst.request.dst_pages.size();
      if (!dst.request.dummy && (s->pages_sent + pages.size() > capacity ||
                                 (last != nullptr && s->pages_sent + pages.size() != capacity))) {
        return OutOfRange(room + ": " + std::to_string(s->pages_sent + pages.size()) +
                          " pages sent" + (last ? " in all" : " so far") + " but decode " +
                          dst.peer->name() + " gave " + std::to_string(capacity));
      }
      if (dst.request.dummy) continue;
      Work w{dst.peer, {}};
      KVF_ASSIGN_OR_RETURN(kv::TransferPlan plan, plan_chunk(dst, pages, s->pages_sent));
      w.plans.push_back(std::move(plan));
      if (last != nullptr) KVF_RETURN_IF_ERROR(plan_extras(dst, *last, w.plans));
      work.push_back(std::move(w));
    }
    s->pages_sent += pages.size();
    if (last != nullptr) {
      s->last_queued = true;
      for (Destination& dst : s->dsts) dst.last_done = dst.request.dummy;
    }
    s->inflight += static_cast<int>(work.size());
  }
  s->cell.advance(RequestState::kTransferring);
  if (work.empty() && last != nullptr) {
    // Every destination is a replicated-MLA dummy: nothing to write.
    s->cell.advance(RequestState::kSuccess);
    finish_if_drained(s);
    return Status::Ok();
  }
  const bool is_last = last != nullptr;
  Status refused;
  for (Work& w : work) {
    auto shard = static_cast<size_t>(w.peer->id % shards_.size());
    Status posted = shards_[shard]->post([this, s, peer = w.peer, plans = std::move(w.plans),
                                          is_last] { run_plans(s, peer, plans, is_last); });
    if (!posted.ok()) {  // no worker thread: the request fails, and this work settles here
      refused = Status(posted.code(), "room " + std::to_string(s->room) + ": " + posted.message());
      fail(s, refused);
      run_plans(s, w.peer, {}, is_last);
    }
  }
  return refused;
}

void PrefillServerImpl::run_plans(const std::shared_ptr<SenderState>& s,
                                  const std::shared_ptr<DecodePeer>& peer,
                                  const std::vector<kv::TransferPlan>& plans, bool last) {
  Status result;
  uint64_t bytes = 0;
  if (stopping_) {
    result = Cancelled("prefill server is stopping");
  } else if (s->cell.state() != RequestState::kFailed) {
    kv::ExecuteOptions eo;
    eo.call_timeout = options_.timeouts.transfer_call_timeout;
    if (metrics_ != nullptr) {
      int64_t unset = 0;
      s->first_post_ns.compare_exchange_strong(unset, Clock::now().time_since_epoch().count(),
                                               std::memory_order_relaxed);
    }
    for (const kv::TransferPlan& plan : plans) {
      result = kv::execute(plan, engine_, peer->engine_peer, eo);
      if (!result.ok()) break;
      bytes += plan.total_bytes();
    }
    if (result.ok() && options_.integrity.enabled && !plans.empty()) {
      // plans[0] is the chunk's KV; aux rows and state slots are not page data.
      std::lock_guard lock(s->mu);
      for (Destination& dst : s->dsts) {
        if (dst.peer == peer) result = dst.digests.add_chunk(plans.front(), peer->layout);
      }
    }
  }
  if (!result.ok() && result.code() != StatusCode::kCancelled) {
    fail(s, Status(result.code(), "room " + std::to_string(s->room) + " to " + peer->name() + ": " +
                                      result.message()));
  } else if (!result.ok()) {
    fail(s, result);
  }
  bool all_done = false;
  {
    std::lock_guard lock(s->mu);
    --s->inflight;
    if (last && result.ok()) {
      for (Destination& dst : s->dsts) {
        if (dst.peer == peer) dst.last_done = true;
      }
    }
    all_done = s->last_queued && s->inflight == 0 &&
               std::all_of(s->dsts.begin(), s->dsts.end(),
                           [](const Destination& d) { return d.last_done; });
  }
  {
    std::lock_guard lock(mu_);
    stats_.bytes_sent += bytes;
  }
  if (all_done && s->cell.advance(RequestState::kSuccess) && metrics_ != nullptr) {
    const Clock::time_point first{
        Clock::duration(s->first_post_ns.load(std::memory_order_relaxed))};
    metrics_->on_transferred(Clock::now() - first);
  }
  finish_if_drained(s);
}

void PrefillServerImpl::fail(const std::shared_ptr<SenderState>& s, const Status& reason) {
  if (s->cell.fail(reason)) {
    log().info("prefill: room {} failed: {}", s->room, reason.to_string());
  }
}

void PrefillServerImpl::finish_if_drained(const std::shared_ptr<SenderState>& s) {
  std::vector<std::pair<std::shared_ptr<DecodePeer>, std::optional<PageIntegrity>>> tell;
  std::vector<std::shared_ptr<DecodePeer>> acks;
  RequestState state = s->cell.state();
  {
    std::lock_guard lock(s->mu);
    if (s->inflight != 0 || !is_final(state)) return;
    acks.swap(s->ack_to);
    // Every destination attached so far is told now, each once; one that attaches after the
    // report (a failed room that was still missing some) is told when it does.
    const bool digests = options_.integrity.enabled && state == RequestState::kSuccess;
    for (Destination& d : s->dsts) {
      if (d.told) continue;
      d.told = true;
      std::optional<PageIntegrity> integrity;
      if (digests && !d.request.dummy) integrity = d.digests.result();
      tell.emplace_back(d.peer, std::move(integrity));
    }
    s->notified = s->dsts.size() >= s->required && s->required > 0;
  }
  Status why = s->cell.failure();
  for (auto& [peer, integrity] : tell) {
    send_status(peer, RequestStatusMessage{s->room, state, why.code(), why.message(),
                                           std::move(integrity)});
  }
  for (auto& peer : acks) send_status(peer, AbortAck{s->room});
  bool done = false;
  {
    std::lock_guard lock(s->mu);
    done = s->notified && s->ack_to.empty() && (s->claimed || state == RequestState::kFailed);
  }
  if (done) forget_room(s->room, s.get());
}

}  // namespace detail

uint64_t KvSender::room() const { return state_ ? state_->room : 0; }
RequestState KvSender::poll() const {
  return state_ ? state_->cell.state() : RequestState::kFailed;
}
Status KvSender::failure() const {
  return state_ ? state_->cell.failure() : FailedPrecondition("empty KvSender");
}
RequestState KvSender::wait_final(std::chrono::milliseconds timeout) const {
  return state_ ? state_->cell.wait_final(timeout) : RequestState::kFailed;
}
RequestState KvSender::wait_at_least(RequestState state, std::chrono::milliseconds timeout) const {
  return state_ ? state_->cell.wait_at_least(state, timeout) : RequestState::kFailed;
}

Status KvSender::send(std::span<const kv::PageIndex> pages, const LastChunkExtras* last) {
  if (!state_) return FailedPrecondition("empty KvSender");
  return state_->server->send_chunk(state_, pages, last);
}

void KvSender::abort(const std::string& reason) {
  if (!state_) return;
  state_->server->fail(
      state_, Cancelled("room " + std::to_string(state_->room) + " aborted by prefill: " + reason));
  state_->server->finish_if_drained(state_);
}

}  // namespace kvferry::pd
