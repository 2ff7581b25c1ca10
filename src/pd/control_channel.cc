#include "pd/control_channel.h"

#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <span>
#include <vector>

#include "core/log_throttle.h"
#include "core/logging.h"
#include "core/named_thread.h"

namespace kvferry::pd {
namespace {
// The reader waits this long for the next frame; liveness is the heartbeat's job.
constexpr auto kReadForever = std::chrono::hours(24 * 365);
// A frame's payload is received in steps of at most this many bytes.
constexpr size_t kPayloadStepBytes = size_t{64} << 10;
// The channel whose reader runs on this thread (none elsewhere). close() asks this, not
// reader_: the reader may call close() (from on_message or on_close) before start() has
// even finished assigning reader_.
thread_local const ControlChannel* t_reader_of = nullptr;

// Kinds of rejected frames with a throttle of their own; further kinds share one.
constexpr size_t kMaxRejectionKinds = 64;

// Rejected frames, which any client can send at will: one line per interval for each kind of
// rejection (the reason's text up to its first number: "control frame magic ", "malformed
// Heartbeat message: ..."), so that a flood of one kind costs one line per interval while the
// first frame of every other kind is still logged with the value it got wrong.
class RejectionWarnings {
 public:
  void warn(const std::string& peer_name, const std::string& reason) {
    throttle_for(reason.substr(0, reason.find_first_of("0123456789")))
        .warn("control channel {}: rejected frame: {}", peer_name, reason);
  }

 private:
  LogThrottle& throttle_for(const std::string& kind) {
    std::lock_guard lock(mu_);
    if (auto it = by_kind_.find(kind); it != by_kind_.end()) return it->second;
    if (by_kind_.size() >= kMaxRejectionKinds) return other_kinds_;
    return by_kind_.try_emplace(kind).first->second;
  }

  std::mutex mu_;
  std::map<std::string, LogThrottle> by_kind_;  // guarded by mu_; entries are never erased
  LogThrottle other_kinds_;
};

// Throttled across every channel of the process: the logger's state, like the logger itself.
RejectionWarnings& rejected_frame_warnings() {
  static RejectionWarnings warnings;
  return warnings;
}
LogThrottle& silent_peer_warnings() {
  static LogThrottle throttle;
  return throttle;
}
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

void ControlChannel::start(const Heartbeats& heartbeats) {
  last_received_ns_ = Clock::now().time_since_epoch().count();
  // Each thread keeps the channel alive until it is done (the reader until it has run
  // on_close), so a callback may drop the owner's last reference without destroying the
  // object under a running thread.
  reader_ = named_thread("kvf-pd-ctl-rx", [self = self_.lock()] {
    t_reader_of = self.get();
    self->read_loop();
  });
  heartbeat_ = named_thread(
      "kvf-pd-ctl-hb", [self = self_.lock(), heartbeats] { self->heartbeat_loop(heartbeats); });
}

ControlChannel::~ControlChannel() {
  close();
  // The last reference was one of the channel's own threads (see start()): that one is
  // exiting, let it go; the other has finished.
  const auto self = std::this_thread::get_id();
  for (std::thread* t : {&reader_, &heartbeat_}) {
    if (!t->joinable()) continue;
    if (t->get_id() == self) {
      t->detach();
    } else {
      t->join();
    }
  }
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
  {
    std::lock_guard lock(close_mu_);  // so the heartbeat thread cannot miss the wake-up
  }
  close_cv_.notify_all();
  // The reader may call close() (from its callbacks): it joins neither itself nor the
  // heartbeat thread (the destructor does).
  if (t_reader_of == this) return;
  if (reader_.joinable()) reader_.join();
  if (heartbeat_.joinable() && heartbeat_.get_id() != std::this_thread::get_id()) {
    heartbeat_.join();
  }
}

void ControlChannel::fail(Status reason) {
  {
    std::lock_guard lock(close_mu_);
    if (failure_.ok()) failure_ = std::move(reason);
  }
  ::shutdown(fd_.get(), SHUT_RDWR);  // the reader wakes, ends and reports failure_
}

void ControlChannel::heartbeat_loop(const Heartbeats& heartbeats) {
  const PdTimeouts& t = heartbeats.timeouts;
  const auto silence = t.effective_heartbeat_timeout();
  Clock::time_point next_beat = Clock::now();
  uint64_t sequence = 0;
  std::unique_lock lock(close_mu_);
  while (!close_cv_.wait_for(lock, t.tick(), [this] { return closed_.load(); })) {
    lock.unlock();
    const auto now = Clock::now();
    if (now - last_received() > silence) {
      silent_peer_warnings().warn("control channel {}: silent for more than {} ms", peer_name_,
                                  silence.count());
      fail(PeerDisconnected("silent for more than " + std::to_string(silence.count()) + " ms"));
      return;
    }
    if (now >= next_beat) {
      next_beat = now + t.heartbeat_interval;
      send(Heartbeat{sequence++, heartbeats.incarnation}).ignore();
    }
    lock.lock();
  }
}

Status ControlChannel::read_one(ControlMessage& out) {
  std::byte header_bytes[kFrameHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(fd_.get(), header_bytes, Clock::now() + kReadForever));
  KVF_ASSIGN_OR_RETURN(FrameHeader header, decode_frame_header(header_bytes));
  const uint32_t limit = max_payload_bytes_.load();
  if (header.payload_bytes > limit) {
    return ProtocolError(std::string(message_type_name(header.type)) + " payload of " +
                         std::to_string(header.payload_bytes) + " bytes exceeds the limit of " +
                         std::to_string(limit) +
                         " bytes before the connection is authenticated and registered");
  }
  // The buffer grows with the bytes that arrived, never to a length nobody has sent yet, nor
  // past the claimed length: a header claiming the limit costs nothing until the bytes come.
  std::vector<std::byte> payload;
  while (payload.size() < header.payload_bytes) {
    const size_t have = payload.size();
    const size_t step = std::min<size_t>(header.payload_bytes - have, kPayloadStepBytes);
    if (payload.capacity() < have + step) {
      payload.reserve(
          std::min<size_t>(header.payload_bytes, std::max(have + step, 2 * payload.capacity())));
    }
    payload.resize(have + step);
    KVF_RETURN_IF_ERROR(
        recv_all(fd_.get(), std::span(payload).subspan(have, step), Clock::now() + kReadForever));
  }
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
    rejected_frame_warnings().warn(peer_name_, reason.message());
  }
  Status failure;
  {
    std::lock_guard lock(close_mu_);
    failure = failure_;
  }
  if (closed_.exchange(true)) {
    reason = Cancelled("control channel to " + peer_name_ + " closed locally");
  } else {
    ::shutdown(fd_.get(), SHUT_RDWR);
  }
  if (!failure.ok()) reason = failure;  // fail() shut the socket: say why, not how it ended
  { std::lock_guard lock(close_mu_); }
  close_cv_.notify_all();
  on_close_(Status(reason.code(), "control channel to " + peer_name_ + ": " + reason.message()));
}

}  // namespace kvferry::pd
