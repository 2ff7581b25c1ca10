// The decode per-request path: KvReceiver, sending the destination to every prefill rank,
// aborts, and the bookkeeping when a request ends.
#include <thread>

#include "core/logging.h"
#include "kvferry/pd/decode_client.h"
#include "pd/decode_state.h"

namespace kvferry::pd {
namespace detail {

Status DecodeClientImpl::init(const std::shared_ptr<ReceiverState>& r,
                              std::vector<kv::PageIndex> pages, uint64_t aux_row,
                              uint64_t state_slot) {
  if (pages.empty()) {
    return InvalidArgument("room " + std::to_string(r->room) + ": init with no pages");
  }
  {
    std::lock_guard lock(r->mu);
    if (r->has_input) {
      return FailedPrecondition("room " + std::to_string(r->room) + ": init called twice");
    }
    if (r->cell.state() == RequestState::kFailed) return r->cell.failure();
    r->has_input = true;
    r->input.room = r->room;
    r->input.dst_pages = std::move(pages);
    r->input.aux_row = aux_row;
    r->input.state_slot = state_slot;
  }
  if (r->cell.state() == RequestState::kWaitingForInput) dispatch(r);
  return Status::Ok();
}

void DecodeClientImpl::dispatch(const std::shared_ptr<ReceiverState>& r) {
  const PrefillInstance& inst = *r->instance;
  const uint32_t prefill_tp = inst.layout.tp_size;
  const uint32_t decode_tp = options_.tp.size;
  std::vector<std::pair<std::shared_ptr<PrefillLink>, TransferRequest>> sends;
  {
    std::lock_guard lock(r->mu);
    if (!r->has_input || r->sent || r->cell.state() != RequestState::kWaitingForInput) return;
    r->sent = true;
    r->transfer_start = Clock::now();
    for (uint32_t rank : inst.ranks) {
      TransferRequest request = r->input;
      request.required_dst_ranks = decode_tp >= prefill_tp ? decode_tp / prefill_tp : 1;
      // Replicated MLA read from several prefill ranks: the first sends, the rest resolve.
      request.dummy = replicated() && rank != inst.ranks.front();
      r->pending_ranks.insert(rank);
      sends.emplace_back(inst.links.at(rank), std::move(request));
    }
  }
  r->cell.advance(RequestState::kTransferring);
  for (auto& [link, request] : sends) {
    Status s = link->channel->send(request);
    if (!s.ok()) {
      fail(r, s);
      settle(r);
      return;
    }
  }
}

void DecodeClientImpl::abort(const std::shared_ptr<ReceiverState>& r, const Status& reason) {
  std::vector<std::shared_ptr<PrefillLink>> tell;
  {
    std::lock_guard lock(r->mu);
    if (is_final(r->cell.state()) && r->ack_pending_ranks.empty()) {
      // Already over; an abort after Success changes nothing.
      if (r->cell.state() == RequestState::kSuccess) return;
    }
    if (r->sent && r->cell.state() != RequestState::kSuccess) {
      for (uint32_t rank : r->instance->ranks) {
        auto link = r->instance->links.at(rank);
        if (link->alive && r->ack_pending_ranks.insert(rank).second) tell.push_back(link);
      }
    }
  }
  fail(r, reason);
  for (auto& link : tell) {
    Status s = link->channel->send(AbortMessage{r->room, reason.message()});
    if (!s.ok()) {
      std::lock_guard lock(r->mu);
      r->ack_pending_ranks.erase(link->prefill_rank);  // connection gone: nothing writes
      r->ack_cv.notify_all();
    }
  }
  settle(r);
}

void DecodeClientImpl::fail(const std::shared_ptr<ReceiverState>& r, const Status& reason) {
  if (r->cell.fail(reason)) {
    log().info("decode: room {} failed: {}", r->room, reason.to_string());
  }
}

void DecodeClientImpl::settle(const std::shared_ptr<ReceiverState>& r) {
  const RequestState state = r->cell.state();
  if (!is_final(state)) return;
  bool forget = false;
  bool count = false;
  {
    std::lock_guard lock(r->mu);
    forget = r->ack_pending_ranks.empty();
    count = !r->counted;
    r->counted = true;
  }
  std::lock_guard lock(mu_);
  if (count) {
    (state == RequestState::kSuccess ? stats_.requests_succeeded : stats_.requests_failed)++;
    if (metrics_ != nullptr) metrics_->on_final(state);
  }
  if (forget) {
    auto it = rooms_.find(r->room);
    if (it != rooms_.end() && it->second == r) rooms_.erase(it);
  }
}

}  // namespace detail

uint64_t KvReceiver::room() const { return state_ ? state_->room : 0; }
RequestState KvReceiver::poll() const {
  return state_ ? state_->cell.state() : RequestState::kFailed;
}
Status KvReceiver::failure() const {
  return state_ ? state_->cell.failure() : FailedPrecondition("empty KvReceiver");
}
RequestState KvReceiver::wait_final(std::chrono::milliseconds timeout) const {
  return state_ ? state_->cell.wait_final(timeout) : RequestState::kFailed;
}
RequestState KvReceiver::wait_at_least(RequestState state,
                                       std::chrono::milliseconds timeout) const {
  return state_ ? state_->cell.wait_at_least(state, timeout) : RequestState::kFailed;
}

Status KvReceiver::init(std::vector<kv::PageIndex> dst_pages, uint64_t aux_row,
                        uint64_t state_slot) {
  if (!state_) return FailedPrecondition("empty KvReceiver");
  return state_->client->init(state_, std::move(dst_pages), aux_row, state_slot);
}

void KvReceiver::abort(const std::string& reason) {
  if (!state_) return;
  state_->client->abort(
      state_, Cancelled("room " + std::to_string(state_->room) + " aborted by decode: " + reason));
}

Status KvReceiver::wait_abort_acked(std::chrono::milliseconds timeout) const {
  if (!state_) return Status::Ok();
  const auto deadline = Clock::now() + timeout;
  std::unique_lock lock(state_->mu);
  if (!state_->ack_cv.wait_until(lock, deadline,
                                 [&] { return state_->ack_pending_ranks.empty(); })) {
    return Timeout("room " + std::to_string(state_->room) + ": " +
                   std::to_string(state_->ack_pending_ranks.size()) +
                   " prefill ranks did not acknowledge the abort within " +
                   std::to_string(timeout.count()) + " ms");
  }
  // The link to a prefill rank was lost: its writes on the way may still land until then.
  const Clock::time_point fence = state_->fenced_until;
  lock.unlock();
  if (Clock::now() < fence) {
    if (deadline < fence) {
      return Timeout(
          "room " + std::to_string(state_->room) +
          ": the link to a prefill rank was lost; its writes may land until " +
          std::to_string(
              std::chrono::duration_cast<std::chrono::milliseconds>(fence - Clock::now()).count()) +
          " ms from now (its transfer timeout)");
    }
    std::this_thread::sleep_until(fence);
  }
  // Prefill is done with the request; a receiving thread of ours may still be inside a copy
  // of it that it began before the deadline.
  state_->client->engine().wait_for_landings();
  return Status::Ok();
}

std::chrono::nanoseconds KvReceiver::transfer_time() const {
  if (!state_) return {};
  std::lock_guard lock(state_->mu);
  if (state_->transfer_end <= state_->transfer_start) return {};
  return state_->transfer_end - state_->transfer_start;
}

}  // namespace kvferry::pd
