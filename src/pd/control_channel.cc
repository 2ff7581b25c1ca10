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
// How long the rest of a heartbeat frame may take once part of it went (see
// try_send_heartbeat): the wheel's thread waits that long at most, and only then.
constexpr auto kHeartbeatRestTimeout = std::chrono::milliseconds(100);

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

void ControlChannel::start(const Heartbeats& heartbeats, HeartbeatWheel& wheel) {
  last_received_ns_ = Clock::now().time_since_epoch().count();
  // The reader keeps the channel alive until it has run on_close, so a callback may drop the
  // owner's last reference without destroying the object under a running thread.
  std::shared_ptr<ControlChannel> self = self_.lock();
  reader_ = named_thread("kvf-pd-ctl-rx", [self] {
    t_reader_of = self.get();
    self->read_loop();
  });
  wheel.add(self, heartbeats);
}

ControlChannel::~ControlChannel() {
  close();
  // The last reference was the reader's own (see start()): it is exiting, let it go.
  if (!reader_.joinable()) return;
  if (reader_.get_id() == std::this_thread::get_id()) {
    reader_.detach();
  } else {
    reader_.join();
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
  // The reader may call close() (from its callbacks): it does not join itself (the
  // destructor lets it go).
  if (t_reader_of == this) return;
  if (reader_.joinable()) reader_.join();
}

void ControlChannel::fail(Status reason) {
  {
    std::lock_guard lock(close_mu_);
    if (failure_.ok()) failure_ = std::move(reason);
  }
  ::shutdown(fd_.get(), SHUT_RDWR);  // the reader wakes, ends and reports failure_
}

bool ControlChannel::tick(Clock::time_point now, const Heartbeats& heartbeats,
                          Clock::time_point& next_beat, uint64_t& sequence) {
  if (closed_) return false;
  const auto silence = heartbeats.timeouts.effective_heartbeat_timeout();
  if (now - last_received() > silence) {
    silent_peer_warnings().warn("control channel {}: silent for more than {} ms", peer_name_,
                                silence.count());
    fail(PeerDisconnected("silent for more than " + std::to_string(silence.count()) + " ms"));
    return false;
  }
  if (now >= next_beat) {
    next_beat = now + heartbeats.timeouts.heartbeat_interval;
    try_send_heartbeat(Heartbeat{sequence++, heartbeats.incarnation});
  }
  return true;
}

void ControlChannel::try_send_heartbeat(const Heartbeat& beat) {
  std::unique_lock lock(send_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // another frame is going out: a sign of life as well
  const std::vector<std::byte> frame = encode_control_message(beat);
  const ssize_t n = ::send(fd_.get(), frame.data(), frame.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n == static_cast<ssize_t>(frame.size())) return;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;  // full
  if (n < 0) {
    ::shutdown(fd_.get(), SHUT_RDWR);  // the reader ends and reports the broken connection
    return;
  }
  // Part of the frame went (the buffer had a few bytes free): the rest must follow before
  // any other frame, or the stream is unusable.
  Status rest = send_all(fd_.get(), std::span(frame).subspan(static_cast<size_t>(n)),
                         Clock::now() + kHeartbeatRestTimeout);
  if (!rest.ok()) ::shutdown(fd_.get(), SHUT_RDWR);
}

HeartbeatWheel::~HeartbeatWheel() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HeartbeatWheel::add(const std::shared_ptr<ControlChannel>& channel,
                         const ControlChannel::Heartbeats& heartbeats) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    // The first beat goes one tick after the start, as every later check does.
    entries_.push_back(Entry{channel, heartbeats, now + heartbeats.timeouts.tick(), now, 0});
    changed_ = true;
    if (!thread_.joinable()) thread_ = named_thread("kvf-pd-beat", [this] { run(); });
  }
  cv_.notify_all();
}

size_t HeartbeatWheel::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

void HeartbeatWheel::run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    changed_ = false;
    const Clock::time_point now = Clock::now();
    // Channels are released after mu_ is: the last reference may be this one, and a
    // channel's destructor joins its reader, whose callbacks may add a channel here.
    std::vector<std::shared_ptr<ControlChannel>> held;
    Clock::time_point wake = now + std::chrono::seconds(1);
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::shared_ptr<ControlChannel> channel = it->channel.lock();
      if (!channel) {
        it = entries_.erase(it);
        continue;
      }
      if (now >= it->next_tick) {
        if (!channel->tick(now, it->heartbeats, it->next_beat, it->sequence)) {
          held.push_back(std::move(channel));
          it = entries_.erase(it);
          continue;
        }
        it->next_tick = now + it->heartbeats.timeouts.tick();
      }
      wake = std::min(wake, it->next_tick);
      held.push_back(std::move(channel));
      ++it;
    }
    lock.unlock();
    held.clear();
    lock.lock();
    cv_.wait_until(lock, wake, [this] { return stopping_ || changed_; });
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
  on_close_(Status(reason.code(), "control channel to " + peer_name_ + ": " + reason.message()));
}

}  // namespace kvferry::pd
