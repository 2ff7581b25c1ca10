#include "pd/control_channel.h"

#include <sys/socket.h>

#include <vector>

#include "core/logging.h"

namespace kvferry::pd {
namespace {
// The reader waits this long for the next frame; liveness is the heartbeat's job.
constexpr auto kReadForever = std::chrono::hours(24 * 365);
}  // namespace

std::shared_ptr<ControlChannel> ControlChannel::open(Fd fd, std::string peer_name,
                                                     OnMessage on_message, OnClose on_close) {
  std::shared_ptr<ControlChannel> channel(new ControlChannel(std::move(fd), std::move(peer_name)));
  channel->on_message_ = std::move(on_message);
  channel->on_close_ = std::move(on_close);
  channel->last_received_ns_ = Clock::now().time_since_epoch().count();
  channel->self_ = channel;
  return channel;
}

void ControlChannel::start() {
  last_received_ns_ = Clock::now().time_since_epoch().count();
  // The reader keeps the channel alive until it has run on_close, so a callback may drop
  // the owner's last reference without destroying the object under the running thread.
  reader_ = std::thread([self = self_.lock()] { self->read_loop(); });
}

ControlChannel::~ControlChannel() {
  close();
  // The last reference was the reader's own (see start()): it is exiting; let it go.
  if (reader_.joinable()) reader_.detach();
}

Status ControlChannel::send(const ControlMessage& message, std::chrono::milliseconds timeout) {
  if (closed_) return PeerDisconnected("control channel to " + peer_name_ + " is closed");
  std::vector<std::byte> frame = encode_control_message(message);
  std::lock_guard lock(send_mu_);
  Status s = send_all(fd_.get(), frame, Clock::now() + timeout);
  if (!s.ok()) {
    // A half-sent frame leaves the stream unusable: drop the connection.
    ::shutdown(fd_.get(), SHUT_RDWR);
    return Status(s.code(), "control channel to " + peer_name_ + ": " + s.message());
  }
  return Status::Ok();
}

void ControlChannel::close() {
  if (!closed_.exchange(true)) ::shutdown(fd_.get(), SHUT_RDWR);
  if (reader_.joinable() && reader_.get_id() != std::this_thread::get_id()) reader_.join();
}

Status ControlChannel::read_one(ControlMessage& out) {
  std::byte header_bytes[kFrameHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(fd_.get(), header_bytes, Clock::now() + kReadForever));
  KVF_ASSIGN_OR_RETURN(FrameHeader header, decode_frame_header(header_bytes));
  std::vector<std::byte> payload(header.payload_bytes);
  KVF_RETURN_IF_ERROR(recv_all(fd_.get(), payload, Clock::now() + kReadForever));
  KVF_ASSIGN_OR_RETURN(out, decode_control_payload(header.type, payload));
  return Status::Ok();
}

void ControlChannel::read_loop() {
  Status reason;
  for (;;) {
    ControlMessage message;
    reason = read_one(message);
    if (!reason.ok()) break;
    last_received_ns_ = Clock::now().time_since_epoch().count();
    on_message_(std::move(message));
  }
  if (reason.code() == StatusCode::kProtocolError) {
    log().warn("control channel {}: rejected frame: {}", peer_name_, reason.message());
  }
  if (closed_.exchange(true)) {
    reason = Cancelled("control channel to " + peer_name_ + " closed locally");
  } else {
    ::shutdown(fd_.get(), SHUT_RDWR);
  }
  on_close_(Status(reason.code(), "control channel to " + peer_name_ + ": " + reason.message()));
}

}  // namespace kvferry::pd
