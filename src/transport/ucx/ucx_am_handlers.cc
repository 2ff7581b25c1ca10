// UcxWorker's active-message handlers (ucx_am_wire.h): the target's checks before a byte
// moves, and the routing of replies to the channel waiting for them. Everything here runs
// in a turn of the worker, inside ucp_worker_progress.
#include <fmt/format.h>

#include <cstring>
#include <memory>

#include "core/logging.h"
#include "transport/batch_progress.h"
#include "transport/landing_fence.h"
#include "transport/ucx/ucx_worker.h"

namespace kvferry::detail {
namespace {

int64_t now_ns() { return ucx_clock_ns(Clock::now()); }

uint32_t wire_code(const Status& s) { return static_cast<uint32_t>(s.code()); }

}  // namespace

// What a send the worker starts on its own (a reply) keeps alive until UCX is done with it.
struct UcxWorker::AmSend {
  UcxAmHeaderBytes header{};
  UcxAmPin pin;  // the payload's source, registered until sent
};

// A rendezvous receive the worker starts, always into a buffer of its own: a write's payload
// (target), copied to its destination once complete; or a reply's (initiator), delivered once
// complete. Nothing is pinned while the bytes come, so a sender that stops or dies mid-way
// holds no region: UCX cannot take back a receive it started (ucp_request_cancel does not
// reach active-message receives), so whatever arrives late lands in this buffer.
struct UcxWorker::AmReceive {
  UcxWorker* worker = nullptr;
  UcxAmId id = UcxAmId::kWrite;
  UcxAmHeader header;
  UcxLandingBuffers::Lease buffer;  // where the payload is received
  size_t length = 0;
  ucp_ep_h reply_ep = nullptr;  // target: where the write's ack goes
  int64_t began_ns = 0;         // target: when the write's header arrived (our clock)
};

Status UcxWorker::set_am_handlers() {
  struct Route {
    UcxAmId id;
    ucp_am_recv_callback_t cb;
  };
  const Route routes[] = {
      {UcxAmId::kPing, &UcxWorker::on_am<UcxAmId::kPing>},
      {UcxAmId::kPong, &UcxWorker::on_am<UcxAmId::kPong>},
      {UcxAmId::kWrite, &UcxWorker::on_am<UcxAmId::kWrite>},
      {UcxAmId::kWriteAck, &UcxWorker::on_am<UcxAmId::kWriteAck>},
      {UcxAmId::kRead, &UcxWorker::on_am<UcxAmId::kRead>},
      {UcxAmId::kReadReply, &UcxWorker::on_am<UcxAmId::kReadReply>},
  };
  for (const Route& r : routes) {
    ucp_am_handler_param_t param{};
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                       UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = static_cast<unsigned>(r.id);
    param.flags = UCP_AM_FLAG_WHOLE_MSG;
    param.cb = r.cb;
    param.arg = this;
    ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &param);
    if (s != UCS_OK) {
      return Internal(fmt::format("ucx: ucp_worker_set_am_recv_handler({}) failed: {}",
                                  static_cast<unsigned>(r.id), ucx_status_text(s)));
    }
  }
  return Status::Ok();
}

template <UcxAmId kId>
ucs_status_t UcxWorker::on_am(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxWorker*>(arg);
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  Result<UcxAmHeader> h = decode_ucx_am_header(header, header_length);
  if (!h.ok()) {
    log().warn("ucx: dropping an active message ({}): {}", static_cast<unsigned>(kId),
               h.status().message());
    return UCS_OK;  // a rendezvous payload is dropped with it
  }
  ucp_ep_h reply_ep =
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) != 0 ? param->reply_ep : nullptr;
  switch (kId) {
    case UcxAmId::kPing:
      if (reply_ep != nullptr) self->serve_ping(*h, reply_ep);
      return UCS_OK;
    case UcxAmId::kWrite:
      if (reply_ep == nullptr) return UCS_OK;  // nobody to acknowledge: not acted on
      return self->serve_write(*h, data, length, rndv, reply_ep);
    case UcxAmId::kRead:
      if (reply_ep != nullptr) self->serve_read(*h, reply_ep);
      return UCS_OK;
    case UcxAmId::kPong:
    case UcxAmId::kWriteAck:
    case UcxAmId::kReadReply: return self->deliver_reply(kId, *h, data, length, rndv);
  }
  return UCS_OK;
}

void UcxWorker::on_am_sent(void* request, ucs_status_t /*status*/, void* user_data) {
  // A reply that failed (the initiator gone) has nobody to tell: its pin goes with it.
  delete static_cast<AmSend*>(user_data);  // NOLINT(cppcoreguidelines-owning-memory)
  ucp_request_free(request);
}

void UcxWorker::send_am(ucp_ep_h ep, UcxAmId id, const UcxAmHeader& h, UcxAmPin pin, size_t bytes) {
  auto send = std::make_unique<AmSend>();
  send->header = encode_ucx_am_header(h);
  send->pin = std::move(pin);
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = ucx_am_payload_flags(bytes);
  param.cb.send = &UcxWorker::on_am_sent;
  param.user_data = send.get();
  const void* payload = bytes != 0 ? send->pin.ptr : nullptr;
  ucs_status_ptr_t request = ucp_am_send_nbx(ep, static_cast<unsigned>(id), send->header.data(),
                                             send->header.size(), payload, bytes, &param);
  if (UCS_PTR_IS_PTR(request)) {
    (void)send.release();  // on_am_sent deletes it
  } else if (UCS_PTR_IS_ERR(request)) {
    log().debug("ucx: an active-message reply could not be sent: {}",
                ucx_status_text(UCS_PTR_STATUS(request)));
  }
}

void UcxWorker::serve_ping(const UcxAmHeader& h, ucp_ep_h reply_ep) {
  UcxAmHeader pong;
  pong.request_id = h.request_id;
  pong.deadline_ns = now_ns();
  send_am(reply_ep, UcxAmId::kPong, pong, UcxAmPin(), 0);
}

ucs_status_t UcxWorker::serve_write(const UcxAmHeader& h, void* data, size_t length, bool rndv,
                                    ucp_ep_h reply_ep) {
  UcxAmHeader ack;
  ack.request_id = h.request_id;
  ack.addr = h.addr;
  ack.length = h.length;
  auto refuse = [&](const Status& why) {
    ack.status = wire_code(why);
    send_am(reply_ep, UcxAmId::kWriteAck, ack, UcxAmPin(), 0);
    return UCS_OK;  // the data (eager) or the rendezvous (dropped) goes with it
  };
  if (length != h.length) {
    return refuse(
        ProtocolError(fmt::format("write header says {} bytes, data has {}", h.length, length)));
  }
  if (length > kUcxMaxAmWriteBytes) {
    return refuse(ProtocolError(fmt::format("write of {} bytes: one request carries at most {}",
                                            length, kUcxMaxAmWriteBytes)));
  }
  Result<UcxAmPin> pin = UcxAmPin();
  {
    LandingWindow window;  // the deadline check and the copy it admits
    pin = check_ucx_am_target(regions_(), h.addr, h.length, h.deadline_ns, now_ns(),
                              kLandingMarginNs);
    if (pin.ok() && !rndv && length != 0) std::memcpy(pin->ptr, data, length);
  }
  if (!pin.ok()) return refuse(pin.status());
  // Let go of the region before the ack: once it is in, the initiator's caller may have the
  // region unregistered, which a pin still held here would refuse.
  pin->release();
  if (!rndv) {
    send_am(reply_ep, UcxAmId::kWriteAck, ack, UcxAmPin(), 0);
    return UCS_OK;
  }
  // Checked now so a refused write costs no transfer; checked again, and pinned only for the
  // copy, once every byte is in (finish_write).
  auto receive = std::make_unique<AmReceive>();
  receive->worker = this;
  receive->id = UcxAmId::kWrite;
  receive->header = h;
  receive->buffer = landing_.acquire(length);
  receive->length = length;
  receive->reply_ep = reply_ep;
  receive->began_ns = now_ns();
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = &UcxWorker::on_reply_received;
  param.user_data = receive.get();
  char* into = receive->buffer.data();
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, data, into, length, &param);
  // From here on the descriptor is UCX's again, whatever the outcome.
  if (UCS_PTR_IS_ERR(request)) {
    refuse(PeerDisconnected(
        fmt::format("rendezvous receive failed: {}", ucx_status_text(UCS_PTR_STATUS(request)))));
  } else if (UCS_PTR_IS_PTR(request)) {
    (void)receive.release();  // on_reply_received finishes it
  } else {
    finish_write(*receive, UCS_OK);  // complete at once
  }
  return UCS_INPROGRESS;
}

void UcxWorker::finish_write(const AmReceive& receive, ucs_status_t status) {
  const UcxAmHeader& h = receive.header;
  if (status != UCS_OK) {  // the sender failed or is gone: nothing of it lands
    write_dropped_log_.warn("ucx: a rendezvous write of {} bytes to [{:#x}, +{}) failed: {}",
                            receive.length, h.addr, h.length, ucx_status_text(status));
    return;
  }
  UcxAmHeader ack;
  ack.request_id = h.request_id;
  ack.addr = h.addr;
  ack.length = h.length;
  const int64_t now = now_ns();
  const int64_t took_ns = now - receive.began_ns;
  Status verdict;
  if (took_ns > std::chrono::nanoseconds(frame_rest_timeout_).count()) {
    verdict = Timeout(fmt::format("write took {} ms, more than the frame-rest timeout of {} ms",
                                  took_ns / 1'000'000, frame_rest_timeout_.count()));
    write_dropped_log_.warn("ucx: dropped a rendezvous write of {} bytes to [{:#x}, +{}): {}",
                            receive.length, h.addr, h.length, verdict.message());
  } else {
    LandingWindow window;  // the deadline check (its clock read inside) and the copy
    Result<UcxAmPin> pin = check_ucx_am_target(regions_(), h.addr, h.length, h.deadline_ns,
                                               now_ns(), kLandingMarginNs);
    if (pin.ok()) {
      if (receive.length != 0) std::memcpy(pin->ptr, receive.buffer.data(), receive.length);
    } else {
      verdict = pin.status();
    }
  }
  ack.status = wire_code(verdict);
  send_am(receive.reply_ep, UcxAmId::kWriteAck, ack, UcxAmPin(), 0);
}

void UcxWorker::serve_read(const UcxAmHeader& h, ucp_ep_h reply_ep) {
  UcxAmHeader reply;
  reply.request_id = h.request_id;
  reply.addr = h.addr;
  reply.length = h.length;
  Result<UcxAmPin> pin = check_ucx_am_target(regions_(), h.addr, h.length, h.deadline_ns, now_ns(),
                                             /*margin_ns=*/0);
  if (!pin.ok()) {
    reply.status = wire_code(pin.status());
    reply.length = 0;
    send_am(reply_ep, UcxAmId::kReadReply, reply, UcxAmPin(), 0);
    return;
  }
  send_am(reply_ep, UcxAmId::kReadReply, reply, std::move(pin).value(), h.length);
}

ucs_status_t UcxWorker::deliver_reply(UcxAmId id, const UcxAmHeader& h, void* data, size_t length,
                                      bool rndv) {
  auto it = am_waiters_.find(h.request_id);
  if (it == am_waiters_.end()) return UCS_OK;  // nobody waits (timed out): dropped
  if (!rndv) {
    UcxAmClient* client = it->second;
    am_waiters_.erase(it);
    client->on_am_reply(id, h, data, length);
    return UCS_OK;
  }
  // A rendezvous payload goes into a buffer of ours first, so whatever arrives late lands
  // there, never in the op's memory; the waiter is asked again once it is complete.
  auto receive = std::make_unique<AmReceive>();
  receive->worker = this;
  receive->id = id;
  receive->header = h;
  receive->buffer = landing_.acquire(length);
  receive->length = length;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = &UcxWorker::on_reply_received;
  param.user_data = receive.get();
  char* into = receive->buffer.data();
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_, data, into, length, &param);
  if (UCS_PTR_IS_PTR(request)) {
    (void)receive.release();
  } else {
    on_reply_received(nullptr, UCS_PTR_STATUS(request), length, receive.release());
  }
  return UCS_INPROGRESS;
}

void UcxWorker::on_reply_received(void* request, ucs_status_t status, size_t length,
                                  void* user_data) {
  std::unique_ptr<AmReceive> receive(static_cast<AmReceive*>(user_data));
  if (request != nullptr) ucp_request_free(request);
  UcxWorker* self = receive->worker;
  if (receive->id == UcxAmId::kWrite) {
    self->finish_write(*receive, status);
    return;
  }
  auto it = self->am_waiters_.find(receive->header.request_id);
  if (it == self->am_waiters_.end()) return;  // nobody waits any more: dropped
  UcxAmClient* client = it->second;
  self->am_waiters_.erase(it);
  UcxAmHeader h = receive->header;
  if (status != UCS_OK) {
    h.status = static_cast<uint32_t>(StatusCode::kPeerDisconnected);
    length = 0;
  }
  client->on_am_reply(receive->id, h, receive->buffer.data(), status == UCS_OK ? length : 0);
}

}  // namespace kvferry::detail
