// TcpLane's lifetime: the connection and its handshake, its tending, and failing or expiring
// what the lane carries (its peer's liveness, the batches' deadlines).
#include "transport/tcp/tcp_lane.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "core/auth.h"

namespace kvferry::detail {

Result<std::shared_ptr<TcpLane>> TcpLane::connect(const TcpLinkOptions& o,
                                                  Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(o.endpoint, deadline));
  std::array<std::byte, kTcpHeaderBytes> raw{};
  TcpHeader hello;
  hello.type = TcpFrame::kHello;
  const auto t_sent = Clock::now();
  hello.deadline_ns = steady_ns(t_sent);
  encode_tcp_header(hello, raw.data());
  auto unreachable = [&](const Status& s) {
    return Status(s.code() == StatusCode::kProtocolError ? s.code() : StatusCode::kPeerUnreachable,
                  "tcp handshake with " + o.peer_name + ": " + s.message());
  };
  if (Status s = send_all(fd.get(), raw, deadline); !s.ok()) return unreachable(s);
  if (Status s = recv_all(fd.get(), raw, deadline); !s.ok()) {
    if (s.code() == StatusCode::kPeerDisconnected) {
      // What a receiver of another protocol version does with our kHello (it logs why).
      s = Status(s.code(), s.message() + fmt::format(" (closed at kHello: a receiver of another "
                                                     "tcp protocol version than {} does that)",
                                                     kTcpVersion));
    }
    return unreachable(s);
  }
  const auto t_received = Clock::now();
  auto ack = decode_tcp_header(raw.data());
  if (!ack.ok()) return unreachable(ack.status());
  if (ack->type != TcpFrame::kHelloAck) return ProtocolError("tcp handshake: expected HelloAck");
  if (ack->request_id != o.expected_incarnation) {
    return PeerDisconnected(fmt::format("peer {} restarted (incarnation {:016x}, expected {:016x})",
                                        o.peer_name, ack->request_id, o.expected_incarnation));
  }
  // The receiver read its clock between t_sent and t_received (ours): the smallest offset
  // consistent with that makes converted deadlines early, never late.
  const int64_t offset_ns = ack->deadline_ns - steady_ns(t_received);
  if (ack->length != 0) {
    AuthNonce nonce;
    if (ack->length != nonce.size()) return ProtocolError("tcp handshake: bad nonce length");
    if (Status s = recv_all(fd.get(), nonce, deadline); !s.ok()) return unreachable(s);
    if (!o.secret) {
      return Unauthenticated("peer " + o.peer_name +
                             " requires authentication; no secret is configured here");
    }
    AuthProof proof = auth_proof(*o.secret, nonce);
    TcpHeader auth;
    auth.type = TcpFrame::kAuth;
    auth.length = proof.size();
    encode_tcp_header(auth, raw.data());
    if (Status s = send_all(fd.get(), raw, deadline); !s.ok()) return unreachable(s);
    if (Status s = send_all(fd.get(), proof, deadline); !s.ok()) return unreachable(s);
    if (Status s = recv_all(fd.get(), raw, deadline); !s.ok()) {
      return Unauthenticated("peer " + o.peer_name + " refused our credentials");
    }
    auto verdict = decode_tcp_header(raw.data());
    if (!verdict.ok() || verdict->type != TcpFrame::kAck || verdict->status != 0) {
      return Unauthenticated("peer " + o.peer_name + " refused our credentials (wrong secret?)");
    }
  }
  // The receiver's idle timeout, at most a day (a larger claim is read as a day).
  const auto peer_idle = std::chrono::milliseconds(std::min<uint64_t>(ack->addr, 86'400'000));
  std::shared_ptr<TcpLane> lane(new TcpLane(std::move(fd), o.peer_name, offset_ns,
                                            o.frame_rest_timeout, peer_idle, o.device, o.service));
  // Watched from the start: an idle lane's peer may close the connection.
  KVF_ASSIGN_OR_RETURN(lane->watch_,
                       o.service->pool().watch(lane->fd_.get(), [weak = std::weak_ptr(lane)] {
                         if (std::shared_ptr<TcpLane> self = weak.lock()) self->on_ready();
                       }));
  return lane;
}

TcpLane::TcpLane(Fd fd, std::string peer, int64_t offset_ns,
                 std::chrono::milliseconds frame_rest_timeout,
                 std::chrono::milliseconds peer_idle_timeout,
                 std::shared_ptr<TcpDeviceStaging> device, std::shared_ptr<TcpLaneService> service)
    : fd_(std::move(fd)),
      peer_(std::move(peer)),
      clock_offset_ns_(offset_ns),
      frame_rest_timeout_(frame_rest_timeout),
      landers_(std::move(device)),
      service_(std::move(service)),
      retire_after_(peer_idle_timeout / 2) {}

// No turn runs any more (each holds the lane): nobody sends, so unsent WRITEs fail here too.
TcpLane::~TcpLane() {
  fail_all(PeerDisconnected("connection to " + peer_ + " closed"), /*sender_gone=*/true);
}

void TcpLane::close() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  fail_all(PeerDisconnected("connection to " + peer_ + " closed"));
}

void TcpLane::want_tending_locked(Clock::time_point when) {
  if (when == Clock::time_point::max() || when >= tend_at_) return;
  tend_at_ = when;
  if (listed_) {
    service_->pool().wake_timer_by(when);
  } else {
    listed_ = true;
    service_->tend_by(shared_from_this(), when);
  }
}

Clock::time_point TcpLane::next_tend_locked(Clock::time_point now) const {
  if (stopping_ || broken_) return Clock::time_point::max();
  Clock::time_point next = Clock::time_point::max();
  for (const auto& [id, c] : in_flight_) {
    // A grace already over while a waiter still reads: looked at again a grace later.
    if (c.waiter_reads) next = std::min(next, std::max(c.sent_at, now) + kWaiterReadGrace);
  }
  if (!in_flight_.empty() || !expired_.empty() || !queue_.empty()) {
    next = std::min(next, now + kReaderIdleSleep);
  } else if (!armed_) {
    next = std::min(next, std::max(last_registered_ + kReaderIdleSleep, now));
  }
  return next;
}

Clock::time_point TcpLane::tend(Clock::time_point now) {
  bool start = false;
  bool check_deadlines = false;
  Clock::time_point next;
  {
    std::lock_guard lock(mu_);
    if (!reading_ && !stopping_ && !broken_) {
      if (in_pos_ != in_end_ || must_read_locked(now)) {
        reading_ = true;
        start = true;
      } else if (!in_flight_.empty() || !expired_.empty()) {
        check_deadlines = true;
      } else if (!armed_ && now >= last_registered_ + kReaderIdleSleep) {
        armed_ = true;  // idle: the pool watches for the peer closing the connection
        watch_->arm();
      }
    }
    next = next_tend_locked(now);
    tend_at_ = next;
    listed_ = next != Clock::time_point::max();
  }
  if (start) post_read_turn();
  if (check_deadlines && expire_overdue()) {
    fail_all(Timeout("peer " + peer_ + " sent nothing past the batch deadlines"));
  }
  return next;
}

bool TcpLane::stale() {
  Clock::time_point last_use;
  bool reading = false;
  {
    std::lock_guard lock(mu_);
    if (broken_) return true;
    if (sending_ || !queue_.empty() || !in_flight_.empty()) return false;
    reading = reading_;
    last_use = std::max(last_registered_, connected_at_);
  }
  const Clock::time_point now = Clock::now();
  // Retired even while a reading turn runs: on an idle lane one starts when the pool's watch
  // sees the receiver's close come in, and until that turn has read the close, the lane would
  // look usable and take a request the close then loses.
  if (retire_after_ != Clock::duration::zero() && now >= last_use + retire_after_) {
    fail_all(PeerDisconnected(fmt::format(
        "connection to {} retired: idle for half its receiver's idle timeout of {} ms", peer_,
        std::chrono::duration_cast<std::chrono::milliseconds>(retire_after_ * 2).count())));
    return true;
  }
  if (reading || now < last_use + kReaderIdleSleep) return false;  // a reader sees a close itself
  std::byte probe{};
  const ssize_t n = ::recv(fd_.get(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))) {
    return false;
  }
  fail_all(lost(n == 0 ? PeerDisconnected("closed by the peer while idle")
                       : ErrnoStatus(StatusCode::kPeerDisconnected, "recv", errno)));
  return true;
}

void TcpLane::fail_all(const Status& why, bool sender_gone) {
  std::deque<TcpChunk> queued;
  std::vector<TcpChunk> flying;
  {
    std::lock_guard lock(mu_);
    if (!broken_) {
      broken_ = true;
      broken_status_ = why;
    }
    queued.swap(queue_);
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      if (!sender_gone && !it->second.sent) {
        ++it;
        continue;
      }
      flying.push_back(std::move(it->second));
      it = in_flight_.erase(it);
    }
    expired_.clear();
  }
  ::shutdown(fd_.get(), SHUT_RDWR);
  for (TcpChunk& c : queued) finish(c, loss_status(c, why));
  for (TcpChunk& c : flying) finish(c, loss_status(c, why));
}

Status TcpLane::loss_status(const TcpChunk& c, const Status& why) const {
  Status own = c.batch->stop_reason();
  if (!own.ok()) return own;
  if (why.code() == StatusCode::kTimeout) {
    return PeerDisconnected("lane to " + peer_ + " closed: " + why.message());
  }
  return why;
}

Clock::time_point TcpLane::latest_deadline() const {
  std::lock_guard lock(mu_);
  Clock::time_point latest{};
  for (const TcpChunk& c : queue_) latest = std::max(latest, c.batch->deadline());
  for (const auto& [id, c] : in_flight_) latest = std::max(latest, c.batch->deadline());
  for (const auto& [id, e] : expired_) latest = std::max(latest, e.deadline);
  return latest;
}

bool TcpLane::expire_overdue() {
  std::vector<TcpChunk> failed;
  bool stuck = false;
  {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    Clock::time_point latest{};
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      TcpChunk& c = it->second;
      latest = std::max(latest, c.batch->deadline());
      if (now < c.batch->deadline() || !c.sent) {
        ++it;
        continue;
      }
      expired_.emplace(it->first, ExpiredRequest{c.kind, c.length, c.batch->deadline()});
      failed.push_back(std::move(c));
      it = in_flight_.erase(it);
    }
    for (const TcpChunk& c : queue_) latest = std::max(latest, c.batch->deadline());
    for (const auto& [id, e] : expired_) latest = std::max(latest, e.deadline);
    const Clock::time_point heard{Clock::duration(last_input_.load())};
    stuck = !expired_.empty() && now >= latest + kLaneGrace && now >= heard + kLaneGrace;
  }
  for (TcpChunk& c : failed) finish(c, expiry_status(c));
  return stuck;
}

}  // namespace kvferry::detail
