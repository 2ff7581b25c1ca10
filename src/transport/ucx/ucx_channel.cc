#include "transport/ucx/ucx_channel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/logging.h"

namespace kvferry::detail {

UcxChannel::UcxChannel(UcxWorker& worker, std::string peer_name, std::string peer_address,
                       std::shared_ptr<PeerLiveness> liveness, UcxDataPath path)
    : worker_(worker),
      peer_name_(std::move(peer_name)),
      peer_address_(std::move(peer_address)),
      liveness_(std::move(liveness)),
      path_(path) {}

UcxChannel::~UcxChannel() {
  // Reached only once the endpoint is closed and no request refers to a job (the worker
  // keeps the channel active until then), or at worker shutdown past its grace period.
  for (Closing& c : closing_) {
    for (ucp_rkey_h k : c.rkeys) ucp_rkey_destroy(k);
  }
}

void UcxChannel::enqueue(std::unique_ptr<UcxJob> job) {
  jobs_.push_back(std::move(job));
  worker_.activate(shared_from_this());
}

void UcxChannel::shut(const Status& why) {
  for (auto& job : jobs_) {
    if (job->error.ok()) job->error = why;
  }
  close_endpoint();
  worker_.activate(shared_from_this());
}

void UcxChannel::abandon() { shut(Cancelled("the engine is shutting down")); }

Status UcxChannel::request_failure(ucs_status_t status, std::string_view what) const {
  if (ep_broken_ || liveness_->is_disconnected()) {
    std::string why =
        liveness_->is_disconnected() ? liveness_->disconnect_reason() : ucx_status_text(ep_error_);
    return PeerDisconnected(
        fmt::format("ucx {} to {} failed: peer gone ({})", what, peer_name_, why));
  }
  if (status == UCS_ERR_CANCELED) {
    return Cancelled(fmt::format("ucx {} to {} was cancelled", what, peer_name_));
  }
  return PeerDisconnected(
      fmt::format("ucx {} to {} failed: {}", what, peer_name_, ucx_status_text(status)));
}

void UcxChannel::on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxChannel*>(arg);
  if (ep != self->ep_) return;  // an endpoint already being closed
  self->ep_broken_ = true;
  self->ep_error_ = status;
  std::string why = fmt::format("ucx endpoint failed: {}", ucx_status_text(status));
  log().warn("peer {}: {}", self->peer_name_, why);
  self->liveness_->mark_disconnected(why);
}

Status UcxChannel::ensure_endpoint() {
  if (ep_ != nullptr && !ep_broken_) return Status::Ok();
  if (ep_ != nullptr) close_endpoint();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address_.data());
  // Peer-failure handling: a dead peer fails its requests. Over tcp it costs rendezvous its
  // zero-copy lanes (UCX selects none whose memory cannot be invalidated), which is why
  // payloads up to kUcxAmEagerMaxBytes go eager; without it, a sender killed mid-rendezvous
  // left the target's receive and landing buffer pending for good.
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxChannel::on_endpoint_error;
  params.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker_.worker(), &params, &ep);
  if (s != UCS_OK) {
    return PeerUnreachable(
        fmt::format("ucx: no endpoint to {}: {}", peer_name_, ucx_status_text(s)));
  }
  ep_ = ep;
  ep_broken_ = false;
  ep_error_ = UCS_OK;
  return Status::Ok();
}

void UcxChannel::close_endpoint() {
  if (ep_ == nullptr) return;
  Closing closing;
  for (auto& [addr, key] : rkeys_) closing.rkeys.push_back(key.rkey);
  rkeys_.clear();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  // Forget the endpoint first: an error callback for it during the close is ours, not the
  // peer's, and must not mark the peer disconnected.
  ucp_ep_h ep = std::exchange(ep_, nullptr);
  ep_broken_ = false;
  if (ping_id_ != 0) {  // asked again on the next endpoint
    worker_.forget_am_request(std::exchange(ping_id_, 0));
  }
  log().debug("peer {}: ucx endpoint force-closed", peer_name_);
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing.request = request;
  closing_.push_back(std::move(closing));
}

bool UcxChannel::reap_closing() {
  bool any = false;
  for (size_t i = 0; i < closing_.size();) {
    Closing& c = closing_[i];
    if (c.request != nullptr && ucp_request_check_status(c.request) == UCS_INPROGRESS) {
      ++i;
      continue;
    }
    if (c.request != nullptr) ucp_request_free(c.request);
    for (ucp_rkey_h k : c.rkeys) ucp_rkey_destroy(k);
    closing_.erase(closing_.begin() + static_cast<ptrdiff_t>(i));
    any = true;
  }
  return any;
}

Result<ucp_rkey_h> UcxChannel::rkey_for(const UcxOp& op) {
  auto it = rkeys_.find(op.region_addr);
  if (it != rkeys_.end() && it->second.packed == *op.rkey) return it->second.rkey;
  if (it != rkeys_.end()) {  // the peer registered a new region at the same address
    ucp_rkey_destroy(it->second.rkey);
    rkeys_.erase(it);
  }
  ucp_rkey_h rkey = nullptr;
  ucs_status_t s = ucp_ep_rkey_unpack(ep_, op.rkey->data(), &rkey);
  if (s != UCS_OK) {
    return ProtocolError(fmt::format("ucx: the rkey of {}'s region at {:#x} does not unpack: {}",
                                     peer_name_, op.region_addr, ucx_status_text(s)));
  }
  rkeys_.emplace(op.region_addr, RemoteKey{*op.rkey, rkey});
  return rkey;
}

void UcxChannel::on_request_done(void* request, ucs_status_t status, void* user_data) {
  auto* job = static_cast<UcxJob*>(user_data);
  --job->outstanding;
  // Resolved to a Status in pump, which knows whether the peer is gone.
  if (status != UCS_OK && job->request_error == UCS_OK) job->request_error = status;
  ucp_request_free(request);
}

void UcxChannel::on_flush_done(void* request, ucs_status_t status, void* user_data) {
  auto* job = static_cast<UcxJob*>(user_data);
  job->flushing = false;
  job->flushed = true;
  if (status != UCS_OK && job->request_error == UCS_OK) job->request_error = status;
  ucp_request_free(request);
}

bool UcxChannel::post_chunks(UcxJob& job) {
  bool posted = false;
  while (job.next_op < job.ops.size() && job.outstanding < kUcxWindowRequests) {
    if (Status why = job.batch->stop_reason(); !why.ok()) {
      job.error = why;
      return posted;
    }
    const UcxOp& op = job.ops[job.next_op];
    Result<ucp_rkey_h> rkey = rkey_for(op);
    if (!rkey.ok()) {
      job.error = rkey.status();
      return posted;
    }
    const uint64_t bytes = std::min(kUcxChunkBytes, op.length - job.next_offset);
    char* local = op.local + job.next_offset;
    const uint64_t remote = op.remote_addr + job.next_offset;
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send = &UcxChannel::on_request_done;
    param.user_data = &job;
    ucs_status_ptr_t request = op.kind == OpKind::kWrite
                                   ? ucp_put_nbx(ep_, local, bytes, remote, *rkey, &param)
                                   : ucp_get_nbx(ep_, local, bytes, remote, *rkey, &param);
    posted = true;
    if (UCS_PTR_IS_ERR(request)) {
      job.error =
          request_failure(UCS_PTR_STATUS(request), op.kind == OpKind::kWrite ? "put" : "get");
      return posted;
    }
    if (request != nullptr) ++job.outstanding;
    job.next_offset += bytes;
    if (job.next_offset == op.length) {
      ++job.next_op;
      job.next_offset = 0;
    }
  }
  return posted;
}

void UcxChannel::start_flush(UcxJob& job) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxChannel::on_flush_done;
  param.user_data = &job;
  ucs_status_ptr_t request = ucp_ep_flush_nbx(ep_, &param);
  if (request == nullptr) {
    job.flushed = true;
  } else if (UCS_PTR_IS_ERR(request)) {
    job.error = request_failure(UCS_PTR_STATUS(request), "flush");
  } else {
    job.flushing = true;
  }
}

void UcxChannel::on_am_chunk_sent(void* request, ucs_status_t status, void* user_data) {
  auto* chunk = static_cast<UcxAmChunk*>(user_data);
  UcxJob* job = chunk->job;
  chunk->sent = true;
  --job->outstanding;
  if (status != UCS_OK && job->request_error == UCS_OK) job->request_error = status;
  ucp_request_free(request);
}

void UcxChannel::on_ping_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  // A failed ping is seen as the endpoint's error, or asked again after a reconnect.
  static_cast<UcxChannel*>(user_data)->ping_sending_ = false;
  ucp_request_free(request);
}

bool UcxChannel::clock_synced() {
  if (clock_synced_) return true;
  if (ping_id_ != 0 || ping_sending_ || ep_ == nullptr) return false;
  ping_id_ = worker_.expect_am_reply(this);
  UcxAmHeader h;
  h.request_id = ping_id_;
  h.deadline_ns = ucx_clock_ns(Clock::now());
  ping_header_ = encode_ucx_am_header(h);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxChannel::on_ping_sent;
  param.user_data = this;
  param.flags = UCP_AM_SEND_FLAG_REPLY;
  ucs_status_ptr_t request =
      ucp_am_send_nbx(ep_, static_cast<unsigned>(UcxAmId::kPing), ping_header_.data(),
                      ping_header_.size(), nullptr, 0, &param);
  if (UCS_PTR_IS_PTR(request)) {
    ping_sending_ = true;
  } else if (UCS_PTR_IS_ERR(request)) {
    log().warn("peer {}: ucx clock ping not sent: {}", peer_name_,
               ucx_status_text(UCS_PTR_STATUS(request)));
    worker_.forget_am_request(std::exchange(ping_id_, 0));
    ep_broken_ = true;  // reconnect on the next pump
    ep_error_ = UCS_PTR_STATUS(request);
  }
  return false;
}

void UcxChannel::forget_replies(UcxJob& job) {
  for (UcxAmChunk& c : job.chunks) {
    if (c.replied) continue;
    c.replied = true;
    awaiting_.erase(c.request_id);
    worker_.forget_am_request(c.request_id);
  }
  job.awaiting = 0;
  job.awaiting_bytes = 0;
}

void UcxChannel::on_am_reply(UcxAmId id, const UcxAmHeader& h, const void* data, size_t length) {
  if (id == UcxAmId::kPong) {
    if (h.request_id != ping_id_) return;
    ping_id_ = 0;
    clock_offset_ns_ = ucx_clock_offset_ns(h.deadline_ns, ucx_clock_ns(Clock::now()));
    clock_synced_ = true;
    log().debug("peer {}: ucx clock offset {} ns", peer_name_, clock_offset_ns_);
    return;
  }
  auto it = awaiting_.find(h.request_id);
  if (it == awaiting_.end()) return;  // forgotten: dropped
  UcxAmChunk& chunk = *it->second;
  awaiting_.erase(it);
  UcxJob& job = *chunk.job;
  chunk.replied = true;
  --job.awaiting;
  job.awaiting_bytes -= chunk.length;
  const bool read = chunk.kind == OpKind::kRead;
  const UcxAmId expected = read ? UcxAmId::kReadReply : UcxAmId::kWriteAck;
  if (id != expected) {
    if (job.error.ok()) {
      job.error = ProtocolError(fmt::format("ucx: {} answered request {} with message {}",
                                            peer_name_, h.request_id, static_cast<unsigned>(id)));
    }
    return;
  }
  Status verdict = ucx_am_reply_status(h.status, peer_name_, read ? "read" : "write");
  if (verdict.ok() && read && length != chunk.length) {
    verdict = ProtocolError(fmt::format("ucx: {} answered a read of {} bytes with {}", peer_name_,
                                        chunk.length, length));
  }
  if (!verdict.ok()) {
    if (job.error.ok()) job.error = verdict;
    return;
  }
  if (!read) return;
  // Lands only while the batch may proceed: stop() waits for this guard, and once it has
  // set the stop reason no copy starts.
  BatchProgress::CopyGuard copying = job.batch->copying();
  if (!job.error.ok()) return;
  if (Status why = job.batch->stop_reason(); !why.ok()) {
    job.error = why;
    return;
  }
  if (length != 0) std::memcpy(chunk.local, data, length);
}

bool UcxChannel::post_am_chunks(UcxJob& job) {
  bool posted = false;
  while (job.next_op < job.ops.size() && job.awaiting < kUcxWindowRequests &&
         job.awaiting_bytes < kUcxAmWindowBytes) {
    if (Status why = job.batch->stop_reason(); !why.ok()) {
      job.error = why;
      return posted;
    }
    const UcxOp& op = job.ops[job.next_op];
    const uint64_t bytes = std::min(kUcxChunkBytes, op.length - job.next_offset);
    UcxAmChunk& chunk = job.chunks.emplace_back();
    chunk.job = &job;
    chunk.kind = op.kind;
    chunk.local = op.local + job.next_offset;
    chunk.length = bytes;
    chunk.request_id = worker_.expect_am_reply(this);
    UcxAmHeader h;
    h.request_id = chunk.request_id;
    h.addr = op.remote_addr + job.next_offset;
    h.length = bytes;
    h.deadline_ns = ucx_target_deadline_ns(job.batch->deadline(), clock_offset_ns_);
    chunk.header = encode_ucx_am_header(h);
    awaiting_.emplace(chunk.request_id, &chunk);
    ++job.awaiting;
    job.awaiting_bytes += bytes;
    const bool write = op.kind == OpKind::kWrite;
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &UcxChannel::on_am_chunk_sent;
    param.user_data = &chunk;
    param.flags = UCP_AM_SEND_FLAG_REPLY | ucx_am_payload_flags(write ? bytes : 0);
    ucs_status_ptr_t request = ucp_am_send_nbx(
        ep_, static_cast<unsigned>(write ? UcxAmId::kWrite : UcxAmId::kRead), chunk.header.data(),
        chunk.header.size(), write ? chunk.local : nullptr, write ? bytes : 0, &param);
    posted = true;
    if (UCS_PTR_IS_ERR(request)) {
      chunk.sent = true;
      job.error = request_failure(UCS_PTR_STATUS(request), write ? "write" : "read request");
      return posted;
    }
    if (request != nullptr) {
      ++job.outstanding;
    } else {
      chunk.sent = true;
    }
    job.next_offset += bytes;
    if (job.next_offset == op.length) {
      ++job.next_op;
      job.next_offset = 0;
    }
  }
  return posted;
}

UcxPumped::Outcome UcxChannel::pump(Clock::time_point now, Clock::time_point& wake_at) {
  Outcome out;
  out.progressed = reap_closing();
  if (ep_broken_) close_endpoint();  // UCX requires closing a failed endpoint
  while (!jobs_.empty()) {
    UcxJob& job = *jobs_.front();
    if (!job.started) {
      job.started = true;
      job.wire = job.batch->on_wire();
      if (job.error.ok()) job.error = job.batch->stop_reason();
      if (job.error.ok()) job.error = ensure_endpoint();
      out.progressed = true;
    }
    if (job.error.ok()) {
      if (Status why = job.batch->stop_reason(); !why.ok()) job.error = why;
    }
    if (job.error.ok() && job.request_error != UCS_OK) {
      const bool read = !job.ops.empty() && job.ops.front().kind == OpKind::kRead;
      const bool am = path_ == UcxDataPath::kActiveMessages;
      job.error = request_failure(job.request_error,
                                  am ? (read ? "read request" : "write") : (read ? "get" : "put"));
    }
    if (!job.error.ok()) {
      forget_replies(job);
      if (job.outstanding > 0 || job.flushing) {
        // In the peer's hands past the point of use: force the requests to complete.
        if (ep_ != nullptr) close_endpoint();
        out.active = true;
        wake_at = std::min(wake_at, now + std::chrono::milliseconds(1));
        return out;
      }
      job.wire.release();
      job.batch->finish_task(job.error);
      jobs_.pop_front();
      out.progressed = true;
      continue;
    }
    if (path_ == UcxDataPath::kActiveMessages) {
      if (ep_ == nullptr) {  // closed after a failed ping
        job.error = ensure_endpoint();
        if (!job.error.ok()) continue;
      }
      if (!clock_synced()) {
        wake_at = std::min(wake_at, job.batch->deadline());
        break;
      }
      if (post_am_chunks(job)) out.progressed = true;
    } else if (post_chunks(job)) {
      out.progressed = true;
    }
    if (!job.error.ok()) continue;
    // Every chunk answered, then, for put/get, the flush: a put's local completion says
    // nothing of its bytes being in, the flush waits for their remote completion. An active
    // message's answer already does: the target acknowledges a WRITE once its bytes are
    // copied into place, and a READ's reply carries them (a flush there cost one more round
    // trip: a single 4 KiB WRITE took 27-33 us at p50 with it, 18-22 without).
    if (job.next_op == job.ops.size() && job.outstanding == 0 && job.awaiting == 0 &&
        !job.flushing && !job.flushed) {
      if (path_ == UcxDataPath::kActiveMessages) {
        job.flushed = true;
      } else {
        start_flush(job);
      }
      out.progressed = true;
      if (!job.error.ok()) continue;
    }
    if (job.flushed && job.outstanding == 0) {
      job.wire.release();
      job.batch->finish_task(Status::Ok());
      jobs_.pop_front();
      out.progressed = true;
      continue;
    }
    wake_at = std::min(wake_at, job.batch->deadline());
    break;
  }
  out.active = !jobs_.empty() || !closing_.empty();
  return out;
}

}  // namespace kvferry::detail
