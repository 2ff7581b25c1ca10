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
// A frame's payload is received in steps of at most this many bytes.
constexpr size_t kPayloadStepBytes = size_t{64} << 10;
// The channel whose reading turn (or start-up failure) runs on this thread, if any: close()
// from its callbacks must not wait for the turn that called it.
thread_local const ControlChannel* t_reader_of = nullptr;
// Sets t_reader_of for the scope of a turn (a pool worker runs many channels' turns).
class ReadingTurn {
 public:
  explicit ReadingTurn(const ControlChannel* channel) : previous_(t_reader_of) {
    t_reader_of = channel;
  }
  ~ReadingTurn() { t_reader_of = previous_; }
  ReadingTurn(const ReadingTurn&) = delete;
  ReadingTurn& operator=(const ReadingTurn&) = delete;

 private:
  const ControlChannel* previous_;
};

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

void ControlChannel::start(const Heartbeats& heartbeats, ControlHub& hub) {
  last_received_ns_ = Clock::now().time_since_epoch().count();
  {
    std::lock_guard lock(end_mu_);
    started_ = true;
  }
  // The watch's callback holds the channel until finish() lets the watch go, so a callback
  // may drop the owner's last reference without destroying the object under a turn.
  std::shared_ptr<ControlChannel> self = self_.lock();
  // Beating first: a channel that finishes below is dropped at the hub's next tick.
  Status started = hub.add(self, heartbeats);
  if (started.ok()) {
    // Held until watch_ is set: the first turn (which may start at once) re-arms through it.
    std::lock_guard lock(watch_mu_);
    Result<IoPool*> pool = hub.readers();
    Result<std::unique_ptr<IoPool::Watch>> watch =
        pool.ok() ? (*pool)->watch(fd_.get(), [self] { self->on_readable(); })
                  : Result<std::unique_ptr<IoPool::Watch>>(pool.status());
    if (watch.ok()) {
      watch_ = std::move(*watch);
    } else {
      started =
          Status(watch.status().code(), "cannot watch its socket: " + watch.status().message());
    }
  }
  if (!started.ok()) {
    std::lock_guard one_turn(turn_mu_);
    ReadingTurn turn(this);
    finish(started);
  }
}

ControlChannel::~ControlChannel() { close(); }

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
  // The last turn sees the end of the stream and runs on_close. A callback of this channel
  // may call close(): it does not wait for its own turn.
  if (t_reader_of == this) return;
  std::unique_lock lock(end_mu_);
  ended_cv_.wait(lock, [this] { return !started_ || ended_; });
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

ControlHub::~ControlHub() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Status ControlHub::add(const std::shared_ptr<ControlChannel>& channel,
                       const ControlChannel::Heartbeats& heartbeats) {
  const Clock::time_point now = Clock::now();
  {
    std::lock_guard lock(mu_);
    if (stopping_) return Status::Ok();
    if (!thread_.joinable()) {
      KVF_ASSIGN_OR_RETURN(thread_, start_named_thread("kvf-pd-beat", [this] { run(); }));
    }
    // The first beat goes one tick after the start, as every later check does.
    entries_.push_back(Entry{channel, heartbeats, now + heartbeats.timeouts.tick(), now, 0});
    changed_ = true;
  }
  cv_.notify_all();
  return Status::Ok();
}

size_t ControlHub::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

Result<IoPool*> ControlHub::readers() {
  std::lock_guard lock(mu_);
  if (!readers_) {
    IoPool::Options options;
    options.name = "kvf-pd-ctl";
    KVF_ASSIGN_OR_RETURN(readers_, IoPool::create(options));
  }
  return readers_.get();
}

void ControlHub::run() {
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

void ControlChannel::on_readable() {
  std::lock_guard one_turn(turn_mu_);
  ReadingTurn turn(this);
  Status reason = read_available();
  if (reason.ok() && !closed_) {
    std::lock_guard lock(watch_mu_);
    watch_->arm();
    return;
  }
  // Closed here while the stream was still open: the turn ends the channel itself.
  if (reason.ok()) reason = PeerDisconnected("connection closed");
  finish(std::move(reason));
}

Status ControlChannel::read_available() {
  for (;;) {
    if (!header_) {
      KVF_ASSIGN_OR_RETURN(const size_t n,
                           recv_ready(fd_.get(), std::span(header_bytes_).subspan(header_have_)));
      if (n == 0) return Status::Ok();
      header_have_ += n;
      if (header_have_ < header_bytes_.size()) continue;
      KVF_ASSIGN_OR_RETURN(FrameHeader header, decode_frame_header(header_bytes_));
      const uint32_t limit = max_payload_bytes_.load();
      if (header.payload_bytes > limit) {
        return ProtocolError(std::string(message_type_name(header.type)) + " payload of " +
                             std::to_string(header.payload_bytes) + " bytes exceeds the limit of " +
                             std::to_string(limit) +
                             " bytes before the connection is authenticated and registered");
      }
      header_ = header;
    }
    // The buffer grows with the bytes that arrive, never to a length nobody has sent yet, nor
    // past the claimed length: a header claiming the limit costs nothing until the bytes come.
    while (payload_.size() < header_->payload_bytes) {
      const size_t have = payload_.size();
      const size_t step = std::min<size_t>(header_->payload_bytes - have, kPayloadStepBytes);
      if (payload_.capacity() < have + step) {
        payload_.reserve(std::min<size_t>(header_->payload_bytes,
                                          std::max(have + step, 2 * payload_.capacity())));
      }
      payload_.resize(have + step);
      Result<size_t> n = recv_ready(fd_.get(), std::span(payload_).subspan(have, step));
      payload_.resize(have + (n.ok() ? *n : 0));
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::Ok();
    }
    Result<ControlMessage> message = decode_control_payload(header_->type, payload_);
    header_.reset();
    header_have_ = 0;
    payload_ = {};  // freed once handed over
    if (!message.ok()) return message.status();
    last_received_ns_ = Clock::now().time_since_epoch().count();
    on_message_(std::move(*message));
  }
}

void ControlChannel::finish(Status reason) {
  // A frame cut short is freed before on_close: the owner may give freed memory back to the
  // system from there (a flood of unfinished frames).
  payload_ = {};
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
  // The pool's reference goes with the watch (this turn's own copy of the callback keeps the
  // channel until the turn returns).
  std::unique_ptr<IoPool::Watch> watch;
  {
    std::lock_guard lock(watch_mu_);
    watch = std::move(watch_);
  }
  watch.reset();
  {
    std::lock_guard lock(end_mu_);
    ended_ = true;
  }
  ended_cv_.notify_all();
}

}  // namespace kvferry::pd
