// TcpLane's sending side: request frames (one range, or a vector frame's table and
// payloads) gathered into one sendmsg, and what a batch's deadline does to a send under way.
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <climits>
#include <optional>

#include "core/byte_codec.h"
#include "transport/tcp/tcp_lane.h"

namespace kvferry::detail {
namespace {

// kTcpChunkBytes of zeros, mapped read-only and never written (nothing backs it but the zero
// page): the rest of a frame whose batch's deadline passed mid-send is finished with these,
// not with the batch's memory (which the user may have released). Null if it cannot be
// mapped.
const std::byte* zero_payload() {
  static const std::byte* const zeros = [] {
    void* p = ::mmap(nullptr, kTcpChunkBytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : static_cast<const std::byte*>(p);
  }();
  return zeros;
}

}  // namespace

void TcpLane::send_turn() {
  send_turn_ = true;
  std::vector<TcpChunk> batch_of_chunks;
  for (;;) {
    batch_of_chunks.clear();
    {
      std::lock_guard lock(mu_);
      // A lane that broke (or closed) failed its queue then.
      if (stopping_ || broken_ || queue_.empty()) {
        sending_ = false;
        return;
      }
      while (!queue_.empty() && batch_of_chunks.size() < kMaxGather) {
        batch_of_chunks.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!send_chunks(batch_of_chunks)) {
      std::lock_guard lock(mu_);
      sending_ = false;
      return;
    }
  }
}

bool TcpLane::send_chunks(std::vector<TcpChunk>& chunks) {
  iov_.clear();
  sent_ids_.clear();
  // The tables are encoded into the sending role's buffer (never the chunk's: a chunk may
  // be failed and freed by the reader while its frame is still being sent), sized once so
  // the iovecs into it stay valid.
  size_t table_bytes = 0;
  for (const TcpChunk& c : chunks) table_bytes += c.pieces.size() * kTcpVecEntryBytes;
  if (tables_.size() < table_bytes) tables_.resize(table_bytes);
  size_t table_at = 0;
  frames_.clear();
  uint64_t stream_bytes = 0;
  size_t slot = 0;
  for (TcpChunk& c : chunks) {
    TcpHeader h;
    const bool vector = !c.pieces.empty();
    if (vector) {
      h.type = c.kind == OpKind::kWrite ? TcpFrame::kWriteV : TcpFrame::kReadV;
      h.addr = c.pieces.size();
    } else {
      h.type = c.kind == OpKind::kWrite ? TcpFrame::kWrite : TcpFrame::kRead;
      h.addr = c.remote_addr;
    }
    h.length = c.length;
    // The frame's iovecs after the header (table, payloads), gathered while the chunk is
    // still ours; dropped again if it does not go out.
    const size_t iov_mark = iov_.size();
    iov_.push_back({});  // the header, filled below
    const size_t payload_mark = iov_mark + (vector ? 2 : 1);
    if (vector) {
      std::byte* table = tables_.data() + table_at;
      for (const TcpPiece& p : c.pieces) {
        store_le(table, p.remote_addr);
        store_le(table + 8, p.length);
        table += kTcpVecEntryBytes;
      }
      iov_.push_back({tables_.data() + table_at, c.pieces.size() * kTcpVecEntryBytes});
      table_at += c.pieces.size() * kTcpVecEntryBytes;
      if (c.kind == OpKind::kWrite) {
        for (const TcpPiece& p : c.pieces) iov_.push_back({p.local, p.length});
      }
    } else if (c.kind == OpKind::kWrite) {
      iov_.push_back({c.local, c.length});
    }
    // The deadline on the receiver's clock, never later than ours.
    h.deadline_ns = steady_ns(c.batch->deadline()) + clock_offset_ns_;
    const OpKind kind = c.kind;
    const std::shared_ptr<BatchProgress> batch = c.batch;
    bool registered = false;
    {
      std::lock_guard lock(mu_);
      // Once broken, fail_all has swept in_flight_: a chunk registered now would
      // never be answered nor failed.
      if (!broken_) {
        h.request_id = next_id_++;
        c.wire = batch->on_wire();
        c.sent = kind != OpKind::kWrite;  // a READ's request reads no local memory
        if (!c.sole) shared_since_idle_ = true;
        last_registered_ = Clock::now();
        if (c.waiter_reads) {
          c.sent_at = last_registered_;
          waiter_read_since_idle_ = true;
          want_tending_locked(c.sent_at + kWaiterReadGrace);  // in case the waiter never reads
        } else if (!reading_ && !armed_) {
          armed_ = true;  // the answer starts a reading turn when it comes
          watch_->arm();
        }
        in_flight_.emplace(h.request_id, std::move(c));
        peak_in_flight_ = std::max(peak_in_flight_, in_flight_.size());
        registered = true;
      }
    }
    if (!registered) {
      iov_.resize(iov_mark);
      finish(c, broken_status());
      continue;
    }
    // Checked only now that the chunk counts as on the wire: stop() marks the batch
    // stopped before it counts what is on the wire, so either it waits for this chunk or
    // we see the stop here (the same handshake as the copier's CopyGuard).
    if (Status why = batch->stop_reason(); !why.ok()) {
      std::optional<TcpChunk> taken;
      {
        std::lock_guard lock(mu_);
        if (auto it = in_flight_.find(h.request_id); it != in_flight_.end()) {
          taken = std::move(it->second);
          in_flight_.erase(it);
        }
      }
      if (taken) finish(*taken, why);  // else fail_all took it meanwhile
      iov_.resize(iov_mark);
      continue;
    }
    encode_tcp_header(h, headers_[slot].data());
    sent_ids_.push_back(h.request_id);
    iov_[iov_mark] = {headers_[slot].data(), kTcpHeaderBytes};
    SentFrame f;
    f.request_id = h.request_id;
    f.kind = kind;
    f.iov_begin = iov_mark;
    f.payload_begin = std::min(payload_mark, iov_.size());
    f.iov_end = iov_.size();
    f.byte_begin = stream_bytes;
    for (size_t i = iov_mark; i < iov_.size(); ++i) stream_bytes += iov_[i].iov_len;
    f.byte_end = stream_bytes;
    f.deadline = batch->deadline();
    f.batch = batch;
    frames_.push_back(std::move(f));
    ++slot;
  }
  chunks.clear();
  if (iov_.empty()) return true;
  Status sent = send_iov(iov_);
  frames_.clear();  // they hold their batches
  if (!sent.ok()) {
    fail_all(sent.code() == StatusCode::kTimeout
                 ? Timeout("sending to " + peer_ + " made no progress past the batch deadlines")
                 : PeerDisconnected("connection to " + peer_ + " lost: " + sent.message()));
    finish_sent(sent_ids_);  // the WRITEs fail_all left to this thread
    return false;
  }
  finish_sent(sent_ids_);
  return true;
}

void TcpLane::finish_sent(const std::vector<uint64_t>& ids) {
  std::vector<TcpChunk> done;
  std::vector<TcpChunk> lost;
  Status why;
  {
    std::lock_guard lock(mu_);
    if (broken_) why = broken_status_;
    for (uint64_t id : ids) {
      auto it = in_flight_.find(id);
      if (it == in_flight_.end()) continue;  // failed meanwhile
      if (it->second.acked) {
        done.push_back(std::move(it->second));
        in_flight_.erase(it);
      } else if (broken_) {
        lost.push_back(std::move(it->second));
        in_flight_.erase(it);
      } else {
        it->second.sent = true;
      }
    }
  }
  for (TcpChunk& c : done) finish(c, reply_status(c.ack_status, c, c.refused_addr));
  for (TcpChunk& c : lost) finish(c, loss_status(c, why));
}

Clock::time_point TcpLane::expire_frames(std::vector<iovec>& iov, size_t first, uint64_t sent,
                                         Clock::time_point now) {
  Clock::time_point next = Clock::time_point::max();
  std::vector<TcpChunk> failed;
  {
    std::lock_guard lock(mu_);
    for (size_t k = 0; k < frames_.size(); ++k) {
      SentFrame& f = frames_[k];
      if (f.expired) continue;
      // Drops the frame, not started: the stream after it moves up.
      auto drop = [&] {
        for (size_t i = f.iov_begin; i < f.iov_end; ++i) iov[i].iov_len = 0;
        const uint64_t bytes = f.byte_end - f.byte_begin;
        f.byte_end = f.byte_begin;
        for (size_t j = k + 1; j < frames_.size(); ++j) {
          frames_[j].byte_begin -= bytes;
          frames_[j].byte_end -= bytes;
        }
      };
      const bool started = sent > f.byte_begin;
      // A READ's request reads no local memory: once started it goes out whole, and the
      // reader deals with its answer.
      if (f.kind == OpKind::kRead && started) {
        f.expired = true;
        continue;
      }
      if (now < f.deadline) {
        next = std::min(next, f.deadline);
        continue;
      }
      f.expired = true;
      auto it = in_flight_.find(f.request_id);
      if (it == in_flight_.end()) {
        // The reader expired it (a READ) or fail_all took it: unsent, nothing is due.
        if (!started) {
          expired_.erase(f.request_id);
          drop();
        }
        continue;
      }
      if (it->second.acked) continue;  // all of it arrived; finish_sent completes it
      failed.push_back(std::move(it->second));
      in_flight_.erase(it);
      if (!started) {
        drop();
        continue;
      }
      const TcpChunk& c = failed.back();
      expired_.emplace(f.request_id, ExpiredRequest{c.kind, c.length, f.deadline});
      for (size_t i = std::max(first, f.payload_begin); i < f.iov_end; ++i) {
        // zero_payload() is checked non-null before a send starts; a payload iovec is at
        // most kTcpChunkBytes.
        iov[i].iov_base = const_cast<std::byte*>(zero_payload());
      }
    }
  }
  for (TcpChunk& c : failed) finish(c, expiry_status(c));
  return next;
}

Status TcpLane::send_iov(std::vector<iovec>& iov) {
  if (zero_payload() == nullptr) return Internal("cannot map the zero payload");
  const bool posting_thread = !send_turn_;
  size_t first = 0;
  uint64_t sent_bytes = 0;
  Clock::time_point own_latest{};
  Clock::time_point next_expiry = Clock::time_point::max();
  for (const SentFrame& f : frames_) {
    own_latest = std::max(own_latest, f.deadline);
    next_expiry = std::min(next_expiry, f.deadline);
  }
  Clock::time_point last_progress = Clock::now();
  while (first < iov.size()) {
    // Each sendmsg that may read a batch's memory holds that batch's CopyGuard, taken
    // before its deadline is checked (expire_frames): stop() waits for it, so a batch
    // never ends while its memory is in a syscall here.
    guard_copies(sent_bytes);
    auto now = Clock::now();
    if (now >= next_expiry) next_expiry = expire_frames(iov, first, sent_bytes, now);
    while (first < iov.size() && iov[first].iov_len == 0) ++first;  // dropped frames
    if (first == iov.size()) break;
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    copy_guards_.clear();
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return ErrnoStatus(StatusCode::kPeerDisconnected, "send", errno);
      }
      // Never declare a timeout before the deadlines themselves: a batch must not end
      // while the receiver may still write it.
      now = Clock::now();
      if (now - last_progress >= kLaneGrace) {
        const Clock::time_point latest = posting_thread ? own_latest : latest_deadline();
        if (now >= latest + kLaneGrace) return Timeout("send");
      }
      auto wait = std::chrono::milliseconds(100);
      if (next_expiry > now) {
        wait = std::min(wait, std::chrono::ceil<std::chrono::milliseconds>(next_expiry - now));
      }
      pollfd p{fd_.get(), POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(wait.count()));
      continue;
    }
    auto sent = static_cast<size_t>(n);
    if (sent != 0) last_progress = Clock::now();
    sent_bytes += sent;
    while (first < iov.size() && sent >= iov[first].iov_len) sent -= iov[first++].iov_len;
    if (first < iov.size()) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + sent;
      iov[first].iov_len -= sent;
    }
  }
  copy_guards_.clear();
  return Status::Ok();
}

}  // namespace kvferry::detail
