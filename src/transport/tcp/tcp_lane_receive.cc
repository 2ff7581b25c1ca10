// TcpLane's reading side: reading turns on the pool and the reading role a waiter may take
// (read_for), the hot wait after a lone request, and the answers: acks, READ payloads
// received straight into local memory or landed in device memory, late answers absorbed.
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <optional>

#include "transport/tcp/tcp_lane.h"

namespace kvferry::detail {

Status TcpLane::read_input_scatter(std::span<iovec> parts, Clock::time_point deadline) {
  size_t first = 0;
  uint64_t left = 0;
  for (const iovec& p : parts) left += p.iov_len;
  // Advances the parts by n received bytes.
  auto consume = [&](size_t n) {
    left -= n;
    while (n != 0) {
      iovec& p = parts[first];
      const size_t take = std::min(n, p.iov_len);
      p.iov_base = static_cast<char*>(p.iov_base) + take;
      p.iov_len -= take;
      n -= take;
      if (p.iov_len == 0) ++first;
    }
    while (first < parts.size() && parts[first].iov_len == 0) ++first;
  };
  consume(0);
  while (left != 0) {
    if (in_pos_ < in_end_) {
      iovec& p = parts[first];
      const size_t n = std::min(p.iov_len, in_end_ - in_pos_);
      std::memcpy(p.iov_base, input_.get() + in_pos_, n);
      in_pos_ += n;
      consume(n);
      continue;
    }
    in_pos_ = in_end_ = 0;
    const bool direct = left >= kDirectReceiveBytes;
    // Filled up to the count passed: not zeroed per receive.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
    std::array<iovec, kMaxReceivePieces + 1> iov;
    size_t count = 0;
    size_t into_parts = 0;
    if (direct) {
      for (size_t i = first; i < parts.size() && count < kMaxReceivePieces; ++i) {
        iov[count++] = parts[i];
        into_parts += parts[i].iov_len;
      }
    }
    iov[count++] = {input_.get(), kReaderBufferBytes};
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = count;
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_DONTWAIT);
    if (n > 0) {
      last_input_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      auto received = static_cast<size_t>(n);
      const size_t direct_bytes = std::min(received, into_parts);
      in_end_ = received - direct_bytes;
      consume(direct_bytes);
      continue;
    }
    if (n == 0) return PeerDisconnected("connection closed by peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return ErrnoStatus(StatusCode::kPeerDisconnected, "recv", errno);
    }
    auto now = Clock::now();
    if (now >= deadline) return Timeout("receive");
    auto wait = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    pollfd p{fd_.get(), POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(wait.count(), 100)));
  }
  return Status::Ok();
}

void TcpLane::read_for(const BatchProgress* batch, Clock::time_point until) {
  bool hot = false;
  {
    std::lock_guard lock(mu_);
    if (reading_ || stopping_ || broken_ || !carries_locked(batch, &hot)) return;
    reading_ = true;
  }
  // A small lone request is answered sooner than a sleeping thread wakes.
  const Clock::time_point start = Clock::now();
  if (hot && start < until) {
    spin_.open(start, kTcpHotTime);
  } else {
    spin_.stop();
  }
  std::array<std::byte, kTcpHeaderBytes> raw{};
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || broken_ || !carries_locked(batch, nullptr)) break;
    }
    if (in_pos_ == in_end_) {
      const Clock::time_point now = Clock::now();
      if (now >= until) {
        if (receive_now() <= 0) break;  // time is up (or a status() poll): what has come
      } else if (spin_.spinning()) {
        const int got = receive_hot();
        if (got < 0) break;
        if (got == 0) continue;
      } else {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now);
        pollfd p{fd_.get(), POLLIN, 0};
        const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
        if (rc <= 0) {
          if (rc == 0 && expire_overdue()) {
            fail_all(Timeout("peer " + peer_ + " sent nothing past the batch deadlines"));
            break;
          }
          continue;
        }
      }
    }
    if (!read_frame(raw)) break;
  }
  lone_answered();  // resets the idle bookkeeping when the lane went idle
  release_reading_role();
}

void TcpLane::release_reading_role() {
  bool start = false;
  {
    std::lock_guard lock(mu_);
    const Clock::time_point now = Clock::now();
    start = !stopping_ && !broken_ && (in_pos_ != in_end_ || must_read_locked(now));
    reading_ = start;
    if (!start) want_tending_locked(next_tend_locked(now));
  }
  if (start) post_read_turn();
}

void TcpLane::end_reading_turn() {
  std::lock_guard lock(mu_);
  reading_ = false;
  const Clock::time_point now = Clock::now();
  if (!stopping_ && !broken_ && must_read_locked(now) && !armed_) {
    armed_ = true;  // nothing has come yet: the answer wakes a turn when it does
    watch_->arm();
  }
  want_tending_locked(next_tend_locked(now));
}

void TcpLane::on_ready() {
  {
    std::lock_guard lock(mu_);
    armed_ = false;
    if (reading_ || stopping_ || broken_) return;  // the holder reads it
    reading_ = true;
  }
  read_turn();
}

void TcpLane::read_turn() {
  std::array<std::byte, kTcpHeaderBytes> raw{};
  spin_.stop();
  for (;;) {
    {
      std::lock_guard lock(mu_);
      if (stopping_ || broken_) {
        reading_ = false;
        return;
      }
    }
    if (in_pos_ == in_end_) {
      // Waits hot for the next answer after a lone one; otherwise takes only what is there.
      const bool hot = spin_.spinning();
      const int got = hot ? receive_hot() : receive_now();
      if (got < 0) break;  // failed (fail_all done)
      if (got == 0) {
        if (hot) continue;
        end_reading_turn();
        return;
      }
    }
    if (!read_frame(raw)) break;
    if (lone_answered()) {
      spin_.open(Clock::now(), kTcpHotTime);
    } else {
      spin_.stop();
    }
  }
  std::lock_guard lock(mu_);
  reading_ = false;
}

Status TcpLane::on_frame(const std::byte* raw) {
  KVF_ASSIGN_OR_RETURN(TcpHeader h, decode_tcp_header(raw));
  if (h.type != TcpFrame::kAck && h.type != TcpFrame::kReadData) {
    return ProtocolError(
        fmt::format("peer {} sent frame type {} on a data lane", peer_, static_cast<int>(h.type)));
  }
  TcpChunk chunk;
  std::optional<ExpiredRequest> expired;
  {
    std::lock_guard lock(mu_);
    auto it = in_flight_.find(h.request_id);
    if (it == in_flight_.end()) {
      auto late = expired_.find(h.request_id);
      if (late == expired_.end()) {
        return ProtocolError(
            fmt::format("peer {} answered unknown request {}", peer_, h.request_id));
      }
      expired = late->second;
      expired_.erase(late);
    } else {
      TcpChunk& entry = it->second;
      if (entry.kind == OpKind::kWrite && h.type == TcpFrame::kAck && !entry.sent) {
        entry.acked = true;  // the sender completes it once its sendmsg has returned
        entry.ack_status = h.status;
        entry.refused_addr = h.addr;
        return Status::Ok();
      }
      chunk = std::move(entry);
      in_flight_.erase(it);
    }
  }
  if (expired) return absorb_late_answer(h, *expired);
  const TcpFrame expected = chunk.kind == OpKind::kWrite ? TcpFrame::kAck : TcpFrame::kReadData;
  if (h.type != expected ||
      (h.type == TcpFrame::kReadData && h.status == 0 && h.length != chunk.length)) {
    finish(chunk, ProtocolError("mismatched reply"));
    return ProtocolError(fmt::format("peer {} answered request {} with frame type {} and length {}",
                                     peer_, h.request_id, static_cast<int>(h.type), h.length));
  }
  Status result = reply_status(h.status, chunk, h.addr);
  if (h.type == TcpFrame::kReadData && h.length != 0) {
    if (h.length != chunk.length) {
      finish(chunk, ProtocolError("read reply of the wrong length"));
      return ProtocolError(
          fmt::format("peer {} sent {} bytes for a {}-byte read", peer_, h.length, chunk.length));
    }
    Status received =
        chunk.local_device >= 0 ? receive_read_into_device(chunk) : receive_read_payload(chunk);
    if (!received.ok() && received.code() != StatusCode::kCancelled &&
        received.code() != StatusCode::kTimeout) {
      finish(chunk, received);
      return received;
    }
    if (result.ok()) result = received;
  }
  finish(chunk, result);
  return Status::Ok();
}

Status TcpLane::absorb_late_answer(const TcpHeader& h, const ExpiredRequest& e) {
  const TcpFrame expected = e.kind == OpKind::kWrite ? TcpFrame::kAck : TcpFrame::kReadData;
  if (h.type != expected ||
      (h.type == TcpFrame::kReadData && h.length != 0 && h.length != e.length)) {
    return ProtocolError(
        fmt::format("peer {} answered expired request {} with frame type {} and length {}", peer_,
                    h.request_id, static_cast<int>(h.type), h.length));
  }
  // Drain target only, never read: not zeroed.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<std::byte, kTcpScratchBytes> scratch;
  for (uint64_t left = h.length; left != 0;) {
    const uint64_t n = std::min<uint64_t>(left, scratch.size());
    if (Status s = read_input({scratch.data(), n}, Clock::now() + frame_rest_timeout_); !s.ok()) {
      return PeerDisconnected("connection to " + peer_ + " lost mid-payload: " + s.message());
    }
    left -= n;
  }
  return Status::Ok();
}

Status TcpLane::receive_read_payload(TcpChunk& c) {
  // Drain target only, never read: not zeroed on the receive path.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<std::byte, kTcpScratchBytes> scratch;
  std::vector<iovec>& window = read_window_;
  size_t piece = 0;     // where the next byte goes: pieces[piece] + offset
  uint64_t offset = 0;  // (or local + offset for a one-range frame)
  uint64_t done = 0;
  Status outcome;
  while (done < c.length) {
    BatchProgress& b = *c.batch;
    auto guard = b.copying();
    Status why = outcome.ok() ? b.stop_reason() : outcome;
    uint64_t n = 0;
    Status s;
    if (why.ok()) {
      window.clear();
      if (c.pieces.empty()) {
        n = std::min(kTcpReceivePieceBytes, c.length - done);
        window.push_back({c.local + done, n});
      } else {
        while (piece < c.pieces.size() && n < kTcpReceivePieceBytes) {
          const TcpPiece& p = c.pieces[piece];
          const uint64_t take = std::min(p.length - offset, kTcpReceivePieceBytes - n);
          window.push_back({p.local + offset, take});
          n += take;
          offset += take;
          if (offset == p.length) {
            ++piece;
            offset = 0;
          }
        }
      }
      s = read_input_scatter(window, std::min(Clock::now() + frame_rest_timeout_, b.deadline()));
      if (s.code() == StatusCode::kTimeout && Clock::now() >= b.deadline()) {
        // The deadline passed mid-piece: nothing more lands, the rest is drained.
        for (const iovec& w : window) n -= w.iov_len;
        outcome = b.stop_reason();
        if (outcome.ok()) outcome = Timeout("batch deadline passed while its READ arrived");
        s = Status::Ok();
      }
    } else {
      outcome = why;
      n = std::min<uint64_t>(c.length - done, scratch.size());
      s = read_input({scratch.data(), n}, Clock::now() + frame_rest_timeout_);
    }
    // The rest of the frame did not come: the stream is lost, not just this request.
    if (!s.ok()) {
      return PeerDisconnected("connection to " + peer_ + " lost mid-payload: " + s.message());
    }
    done += n;
  }
  return outcome;
}

Status TcpLane::receive_read_into_device(TcpChunk& c) {
  // Drain target only, never read: not zeroed on the receive path.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<std::byte, kTcpScratchBytes> scratch;
  Result<TcpDeviceLander*> lander = landers_.for_device(c.local_device);
  Status outcome = lander.ok() ? Status::Ok() : lander.status();
  CudaEvent after = c.after_event;
  BatchProgress& b = *c.batch;
  uint64_t done = 0;
  uint64_t staged = 0;
  while (done < c.length) {
    std::span<std::byte> into;
    if (outcome.ok()) {
      TcpDeviceLander& l = **lander;
      into = {reinterpret_cast<std::byte*>(l.buffer()) + staged,
              std::min({kTcpReceivePieceBytes, c.length - done, l.capacity() - staged})};
    } else {
      into = {scratch.data(), std::min<uint64_t>(scratch.size(), c.length - done)};
    }
    if (Status s = read_input(into, Clock::now() + frame_rest_timeout_); !s.ok()) {
      return PeerDisconnected("connection to " + peer_ + " lost mid-payload: " + s.message());
    }
    done += into.size();
    if (!outcome.ok()) continue;
    staged += into.size();
    if (staged == (*lander)->capacity() || done == c.length) {
      auto guard = b.copying();
      outcome = b.stop_reason();
      if (outcome.ok()) {
        outcome = (*lander)->land(c.local + (done - staged), staged, std::exchange(after, nullptr));
      }
      staged = 0;
    }
  }
  return outcome;
}

}  // namespace kvferry::detail
