#include "transport/tcp/tcp_link.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>
#include <unordered_map>

#include "core/auth.h"
#include "core/byte_codec.h"
#include "core/logging.h"
#include "core/named_thread.h"
#include "transport/tcp/tcp_device_lander.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry::detail {
namespace {

int64_t to_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// One op of a vector frame: where its bytes are here and at the peer.
struct TcpPiece {
  char* local = nullptr;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};

// One request frame: a range (kWrite / kRead) or, when `pieces` is not empty, many small ones
// (kWriteV / kReadV; then local, remote_addr and length are the first piece's addresses and
// the total).
struct TcpChunk {
  std::shared_ptr<BatchProgress> batch;
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
  std::vector<TcpPiece> pieces;
  // The whole part went in this one frame (a request/answer exchange: the reader may wait
  // hot for its answer).
  bool sole = false;
  // Sent on the posting thread, whose wait for the batch reads the answer (the reading
  // role): the reader thread leaves it alone for kWaiterReadGrace after it was sent.
  bool waiter_reads = false;
  Clock::time_point sent_at{};
  // A WRITE completes only when it is both acknowledged and its sendmsg has returned:
  // on loopback the ack can overtake the syscall, and the caller may free the buffer
  // the moment the batch completes.
  bool sent = false;
  bool acked = false;
  uint32_t ack_status = 0;
  uint64_t refused_addr = 0;  // the ack's addr (a vector frame's refused entry)
  // Held from the moment the request is registered for sending until it is answered or
  // failed: the batch's stop() waits for it.
  BatchProgress::WireGuard wire;
  // A WRITE from device memory: the pinned buffer `local` points into, returned when the
  // chunk ends.
  StagingLease staging;
  // A READ into device memory (of this device): its payload is landed by the lane's reader.
  int local_device = -1;
  CudaEvent after_event = nullptr;  // the landing copies wait for it (after_cuda_event)
};

// Chunks per sendmsg: a header and a payload iovec each, within IOV_MAX.
constexpr size_t kMaxGather = 512;
// A lane that is idle sends a post's chunks on the posting thread when they are at most this
// many bytes: the socket buffer takes them at once, and the hand-off to the sender thread (a
// wake-up, tens of microseconds on a busy machine) is the largest cost of a small op.
constexpr uint64_t kInlineSendBytes = uint64_t{256} << 10;
// A part of at most this many bytes goes on one lane (as one frame when its ops pack), sent on
// the posting thread, and its answer is read by the thread that waits for the batch (see
// TcpLane::read_for): one receiver, one sender, and two wake-ups per batch, as in a plain
// stream. Split over two lanes it crossed six threads.
constexpr uint64_t kOneLaneBytes = uint64_t{512} << 10;
// A larger part is striped over the lanes in chunks of at least this many bytes (or half the
// part, if that is less): with four lanes, a 1 MiB READ cut in four 256 KiB chunks woke four
// readers and took longer than two chunks of 512 KiB (docs/TRANSPORTS.md "tcp lanes").
constexpr uint64_t kStripeChunkBytes = uint64_t{1} << 20;
// How long the reader thread leaves an answer to the posting thread's wait: a batch that
// nobody waits for (status() polling) is read by the reader thread after this.
constexpr std::chrono::microseconds kWaiterReadGrace{1000};
// A lane without a request for this long is idle: its reader thread waits in poll() for a
// closed connection (up to this long at a time) instead of on its condition variable.
constexpr std::chrono::milliseconds kReaderIdleSleep{50};
// After the answer to a lone request (one that had the lane to itself) the reader polls
// without sleeping for kTcpHotTime before it blocks (tcp_wire.h), and the waiter of a lone
// request of at most kTcpHotRequestBytes polls for its answer. Only after lone requests: with
// several in flight the answers keep the reader busy anyway, and polling would take the core
// the receiver and the sender need (measured: 4 KiB x 16 took twice as long with it). And
// only after a request that carried its whole part (a frame that is one of several of a part,
// on several lanes, would have every lane's reader spin while the receivers need the cores).
// Input is received into a buffer of this size, so one recv() brings in many acks (or small
// READ payloads, copied out of it); a READ payload with at least kDirectReceiveBytes still to
// come is received straight into local memory, with what follows it into the buffer.
constexpr size_t kReaderBufferBytes = size_t{64} << 10;
constexpr size_t kDirectReceiveBytes = size_t{16} << 10;
// A READ payload is received straight into at most this many pieces per recvmsg: a whole
// vector frame's (kVecMaxEntries), so none of its bytes land in the buffer to be copied again.
constexpr size_t kMaxReceivePieces = 256;
// Consecutive ops of a part of at most kVecOpBytes each (host memory on both sides, same
// kind) are packed into one vector frame of at most kVecMaxEntries entries and the part's
// chunk size: one header, one request entry and one ack for all of them. 256 KiB takes in
// one deepseek-v3 page (72 KiB), which at 64 KiB went as a frame and an ack each (A/B, 9
// pairs: WRITE 72 KiB x 128 / plain stream 1.28 -> 1.42, READ 1.15 -> 1.27).
constexpr uint64_t kVecOpBytes = uint64_t{256} << 10;
constexpr size_t kVecMaxEntries = 256;
static_assert(kVecMaxEntries <= kTcpMaxVecEntries);
static_assert(kVecMaxEntries <= kMaxReceivePieces);
// A lane whose peer shows no life (nothing received, nothing sent) is closed only once every
// batch on it is this far past its deadline: until then a stopped peer may resume and serve
// the batches that still have time.
constexpr std::chrono::milliseconds kLaneGrace{100};

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

// A request failed at its batch's deadline whose answer is still due: absorbed when it comes
// (a READ's payload drained, never landed).
struct ExpiredRequest {
  OpKind kind = OpKind::kWrite;
  uint64_t length = 0;
  Clock::time_point deadline;
};

// Where one frame of a gathered send lies in the iovecs and in the byte stream.
struct SentFrame {
  uint64_t request_id = 0;
  OpKind kind = OpKind::kWrite;
  std::shared_ptr<BatchProgress> batch;
  size_t iov_begin = 0;
  size_t payload_begin = 0;  // the first iovec of local memory (iov_end if none)
  size_t iov_end = 0;
  uint64_t byte_begin = 0;
  uint64_t byte_end = 0;
  Clock::time_point deadline;
  bool expired = false;  // its deadline was dealt with
};

}  // namespace

class TcpLane {
 public:
  // Connects and runs the tcp handshake, all of it before `deadline`.
  static Result<std::shared_ptr<TcpLane>> connect(const TcpLinkOptions& o,
                                                  Clock::time_point deadline);
  ~TcpLane() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    reader_cv_.notify_all();
    ::shutdown(fd_.get(), SHUT_RDWR);
    sender_.join();
    reader_.join();
    fail_all(PeerDisconnected("connection to " + peer_ + " closed"), /*sender_gone=*/true);
  }

  bool broken() const {
    std::lock_guard lock(mu_);
    return broken_;
  }

  // Nothing is queued, being sent or waiting for its answer here.
  bool idle() const {
    std::lock_guard lock(mu_);
    return !broken_ && !sending_ && queue_.empty() && in_flight_.empty();
  }

  // Queues the chunks for the sender thread, or, when `send_here_if_idle` and nobody is
  // sending on this lane, sends them on the calling thread (and, with `waiter_reads`, leaves
  // their answers to that thread's wait for the batch: read_for).
  void enqueue(std::vector<TcpChunk>& chunks, bool send_here_if_idle, bool waiter_reads = false) {
    bool send_here = false;
    {
      std::lock_guard lock(mu_);
      if (!broken_) {
        if (send_here_if_idle && !sending_ && queue_.empty() && chunks.size() <= kMaxGather) {
          sending_ = true;
          send_here = true;
        } else {
          for (TcpChunk& c : chunks) queue_.push_back(std::move(c));
          chunks.clear();
        }
      }
    }
    if (send_here) {
      for (TcpChunk& c : chunks) c.waiter_reads = waiter_reads;
      send_chunks(chunks);
      release_sending();
      return;
    }
    // A lane that broke meanwhile fails what it was given.
    for (TcpChunk& c : chunks) finish(c, broken_status());
    cv_.notify_one();
  }

 private:
  TcpLane(Fd fd, std::string peer, int64_t offset_ns, std::chrono::milliseconds frame_rest_timeout,
          std::shared_ptr<TcpDeviceStaging> device)
      : fd_(std::move(fd)),
        peer_(std::move(peer)),
        clock_offset_ns_(offset_ns),
        frame_rest_timeout_(frame_rest_timeout),
        landers_(std::move(device)) {
    sender_ = named_thread("kvf-tcp-tx", [this] { send_loop(); });
    reader_ = named_thread("kvf-tcp-rx", [this] { read_loop(); });
  }

  Status broken_status() const {
    std::lock_guard lock(mu_);
    return broken_status_.ok() ? PeerDisconnected("connection to " + peer_ + " is broken")
                               : broken_status_;
  }

  static void finish(TcpChunk& c, const Status& s) {
    c.wire.release();
    c.batch->finish_task(s);
  }

  // Marks the lane broken and fails everything queued or in flight on it, except a WRITE
  // whose sendmsg has not returned (the sending role may still be reading its memory): the
  // socket is shut down, so that send ends at once, and the sender fails it then
  // (finish_sent). `sender_gone`: nobody sends any more (the lane's destructor), so those
  // fail here too.
  void fail_all(const Status& why, bool sender_gone = false) {
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
    cv_.notify_all();
    for (TcpChunk& c : queued) finish(c, loss_status(c, why));
    for (TcpChunk& c : flying) finish(c, loss_status(c, why));
  }

  // Why a chunk fails when the lane is lost (`why`): for its own batch's reason when it has
  // one (its deadline passed, it was cancelled); otherwise the lane's loss is a
  // disconnection for it, even when the lane died of another batch's timeout.
  Status loss_status(const TcpChunk& c, const Status& why) const {
    Status own = c.batch->stop_reason();
    if (!own.ok()) return own;
    if (why.code() == StatusCode::kTimeout) {
      return PeerDisconnected("lane to " + peer_ + " closed: " + why.message());
    }
    return why;
  }

  // Gives up the sending role; the sender thread takes what was queued meanwhile.
  void release_sending() {
    bool more = false;
    {
      std::lock_guard lock(mu_);
      sending_ = false;
      more = !queue_.empty();
    }
    if (more) cv_.notify_one();
  }

  void send_loop() {
    std::vector<TcpChunk> batch_of_chunks;
    for (;;) {
      batch_of_chunks.clear();
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || broken_ || (!queue_.empty() && !sending_); });
        if (stopping_ || broken_) return;
        sending_ = true;
        while (!queue_.empty() && batch_of_chunks.size() < kMaxGather) {
          batch_of_chunks.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      const bool ok = send_chunks(batch_of_chunks);
      release_sending();
      if (!ok) return;
    }
  }

  // Registers the chunks as in flight and sends them in one gathered sendmsg (or as few as
  // the socket needs). Only the holder of the sending role calls it. False: the lane broke
  // (everything on it has been failed).
  bool send_chunks(std::vector<TcpChunk>& chunks) {
    const bool waiter_reads = !chunks.empty() && chunks.front().waiter_reads;
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
      h.deadline_ns = to_ns(c.batch->deadline()) + clock_offset_ns_;
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
    wake_reader(waiter_reads);
    return true;
  }

  // After a send: the reader thread, asleep on reader_cv_, reads the answers (unless a waiter
  // reads them: then it looks again after kWaiterReadGrace).
  void wake_reader(bool waiter_reads) {
    if (waiter_reads) return;
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      wake = reader_asleep_;
    }
    if (wake) reader_cv_.notify_one();
  }

  // Marks the requests as sent (their sendmsg has returned: nothing reads their memory
  // any more); those already acknowledged complete now, and on a lane that broke meanwhile
  // the others fail now (fail_all left them to this thread).
  void finish_sent(const std::vector<uint64_t>& ids) {
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

  // `refused_addr`: the reply's addr, which names the entry a vector frame was refused for.
  Status reply_status(uint32_t status, const TcpChunk& c, uint64_t refused_addr) const {
    if (status == 0) return Status::Ok();
    if (!c.pieces.empty()) {
      return Status(static_cast<StatusCode>(status),
                    fmt::format("peer {} refused a request of {} ranges for the one at {:#x}: {}",
                                peer_, c.pieces.size(), refused_addr,
                                status_code_name(static_cast<StatusCode>(status))));
    }
    return Status(static_cast<StatusCode>(status),
                  fmt::format("peer {} refused a request at {:#x}: {}", peer_, c.remote_addr,
                              status_code_name(static_cast<StatusCode>(status))));
  }

  // Why a chunk failed at its batch's deadline.
  static Status expiry_status(const TcpChunk& c) {
    Status own = c.batch->stop_reason();
    return own.ok() ? Timeout("batch deadline passed before its request was answered") : own;
  }

  // The latest deadline of what the lane carries (queued, in flight, or answered late), or
  // the epoch when it carries nothing.
  Clock::time_point latest_deadline() const {
    std::lock_guard lock(mu_);
    Clock::time_point latest{};
    for (const TcpChunk& c : queue_) latest = std::max(latest, c.batch->deadline());
    for (const auto& [id, c] : in_flight_) latest = std::max(latest, c.batch->deadline());
    for (const auto& [id, e] : expired_) latest = std::max(latest, e.deadline);
    return latest;
  }

  // Deals with the frames of this send (frames_) whose batch's deadline has passed, with
  // `sent` bytes of the stream out: past the deadline nothing more is read from local
  // memory (stop() may have released it). A frame not started yet is dropped; a WRITE frame
  // partly sent is finished with zeros in place of the rest of its payload (the receiver,
  // past the same deadline on its clock, drains them and acks Timeout) and its answer is
  // absorbed when it comes; either way its chunk fails now. Returns the next deadline to
  // watch.
  Clock::time_point expire_frames(std::vector<iovec>& iov, size_t first, uint64_t sent,
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

  // Sends the iovecs of frames_. A batch's deadline passing mid-send fails that batch's
  // frames (expire_frames) and the others go on. The lane gives up (Timeout) only when no
  // byte went out for kLaneGrace and every batch on the lane is kLaneGrace past its deadline;
  // on the posting thread, once the frames it sends are (it must not be held for others).
  Status send_iov(std::vector<iovec>& iov) {
    if (zero_payload() == nullptr) return Internal("cannot map the zero payload");
    const bool posting_thread = std::this_thread::get_id() != sender_.get_id();
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

  // Takes the CopyGuard of every batch with a WRITE frame of this send whose payload is not
  // all out (`sent` bytes of the stream are) and not replaced by zeros.
  void guard_copies(uint64_t sent) {
    copy_guards_.clear();
    const BatchProgress* last = nullptr;
    for (const SentFrame& f : frames_) {
      if (f.kind != OpKind::kWrite || f.expired || f.byte_end <= sent || f.batch.get() == last) {
        continue;
      }
      last = f.batch.get();
      copy_guards_.emplace_back(*f.batch);
    }
  }

  // Fails the requests past their batch's deadline that are all out (a WRITE still being
  // sent is the sender's: expire_frames) with Timeout; their answers, still due, are
  // absorbed when they come. True when the lane looks stuck: an answer is still due, the
  // peer sent nothing for kLaneGrace, and every batch on the lane is kLaneGrace past its
  // deadline.
  bool expire_overdue() {
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

  // Waits until input is available: polls without sleeping until `hot_until`, then sleeps
  // (waking every 50 ms to expire overdue requests). False: the reader is done.
  bool wait_readable(Clock::time_point hot_until) {
    for (;;) {
      pollfd p{fd_.get(), POLLIN, 0};
      const bool hot = Clock::now() < hot_until;
      int rc = ::poll(&p, 1, hot ? 0 : 50);
      if (rc > 0) return true;
      if (hot) continue;
      {
        std::lock_guard lock(mu_);
        if (stopping_ || broken_) return false;
      }
      if (rc == 0 && expire_overdue()) {
        fail_all(Timeout("peer " + peer_ + " sent nothing past the batch deadlines"));
        return false;
      }
    }
  }

  // Fills `out` from the input buffer, then from the socket (large remainders straight into
  // `out`, with what follows into the buffer), until `deadline`.
  Status read_input(std::span<std::byte> out, Clock::time_point deadline) {
    iovec one{out.data(), out.size()};
    return read_input_scatter({&one, 1}, deadline);
  }

  // The same for many ranges, filled in order; the iovecs are consumed (advanced) as they
  // fill. The socket's bytes go straight into up to kMaxReceivePieces ranges per recvmsg
  // when at least kDirectReceiveBytes are still wanted.
  Status read_input_scatter(std::span<iovec> parts, Clock::time_point deadline) {
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

  // True once, when the lane has just gone idle after carrying a single request that the
  // reader thread answers (a waiter that reads its own answers waits hot itself).
  bool lone_answered() {
    std::lock_guard lock(mu_);
    if (!in_flight_.empty()) return false;
    const bool lone = peak_in_flight_ == 1 && !shared_since_idle_ && !waiter_read_since_idle_;
    peak_in_flight_ = 0;
    shared_since_idle_ = false;
    waiter_read_since_idle_ = false;
    return lone;
  }

 public:
  // The reading role, taken by the thread that waits for `batch` (its BatchHelper): while
  // the lane's reader thread rests and the batch has a request in flight here, reads the
  // lane's answers on this thread (those of other batches too) until the batch has none left
  // here, or `until`. So the answer wakes the waiter itself, not the reader thread that would
  // then wake it. Landing in device memory stays the reader thread's.
  void read_for(const BatchProgress* batch, Clock::time_point until) {
    bool hot = false;
    {
      std::lock_guard lock(mu_);
      if (reading_ || stopping_ || broken_ || !carries_locked(batch, &hot)) return;
      reading_ = true;
    }
    // A small lone request is answered sooner than a sleeping thread wakes.
    const Clock::time_point hot_until = hot ? Clock::now() + kTcpHotTime : Clock::time_point{};
    std::array<std::byte, kTcpHeaderBytes> raw{};
    for (;;) {
      {
        std::lock_guard lock(mu_);
        if (stopping_ || broken_ || !carries_locked(batch, nullptr)) break;
      }
      if (in_pos_ == in_end_) {
        const Clock::time_point now = Clock::now();
        if (now >= until) break;
        if (now < hot_until) {
          const int got = receive_now();
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

 private:
  // Whether `batch` has a request in flight here that a waiter may read (none lands in
  // device memory); `hot`: it is one small lone request. mu_ held.
  bool carries_locked(const BatchProgress* batch, bool* hot) const {
    bool found = false;
    for (const auto& [id, c] : in_flight_) {
      if (c.local_device >= 0) return false;
      if (c.batch.get() == batch) {
        found = true;
        if (hot != nullptr) *hot = c.sole && c.length <= kTcpHotRequestBytes;
      }
    }
    return found;
  }

  // The reader thread takes the reading role when there is something for it to read: input
  // already buffered, or a request in flight that no waiter reads (one left to a waiter is
  // its own after kWaiterReadGrace). While requests are left to waiters, or the lane was busy
  // within kReaderIdleSleep, it sleeps on reader_cv_ (kWaiterReadGrace at a time); on an idle
  // lane it holds the role and sleeps in poll(), so a closed connection is seen at once
  // (`readable`: input came, to be read). False: the lane is done.
  bool take_reading_role(bool& readable) {
    readable = false;
    std::unique_lock lock(mu_);
    for (;;) {
      if (stopping_ || broken_) return false;
      const Clock::time_point now = Clock::now();
      if (!reading_) {
        bool needed = in_pos_ != in_end_;
        for (const auto& [id, c] : in_flight_) {
          if (!c.waiter_reads || now >= c.sent_at + kWaiterReadGrace) needed = true;
        }
        if (needed) {
          reading_ = true;
          return true;
        }
        if (in_flight_.empty() && now - last_registered_ >= kReaderIdleSleep) {
          reading_ = true;
          lock.unlock();
          pollfd p{fd_.get(), POLLIN, 0};
          if (::poll(&p, 1, static_cast<int>(kReaderIdleSleep.count())) > 0) {
            readable = true;
            return true;
          }
          lock.lock();
          reading_ = false;
          continue;
        }
      }
      reader_asleep_ = true;
      reader_cv_.wait_until(lock, now + kWaiterReadGrace);
      reader_asleep_ = false;
    }
  }

  // Gives up the reading role; the reader thread takes what is left.
  void release_reading_role() {
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      reading_ = false;
      wake = reader_asleep_ && (in_pos_ != in_end_ || !in_flight_.empty());
    }
    if (wake) reader_cv_.notify_one();
  }

  // Whether the reader thread may give up the reading role now: nothing it must read is in
  // flight (input buffered is read first).
  bool thread_may_rest() {
    std::lock_guard lock(mu_);
    const Clock::time_point now = Clock::now();
    for (const auto& [id, c] : in_flight_) {
      if (!c.waiter_reads || now >= c.sent_at + kWaiterReadGrace) return false;
    }
    return true;
  }

  void read_loop() {
    std::array<std::byte, kTcpHeaderBytes> raw{};
    Clock::time_point hot_until{};
    bool readable = false;
    for (;;) {
      if (!take_reading_role(readable)) return;
      for (;;) {
        if (in_pos_ == in_end_ && !std::exchange(readable, false)) {
          if (thread_may_rest()) {
            // Waits hot for the next answer after a lone one, then rests.
            if (Clock::now() >= hot_until) break;
            const int got = receive_now();
            if (got < 0) {
              release_reading_role();
              return;
            }
            if (got == 0) continue;
          } else if (!wait_readable(hot_until)) {
            release_reading_role();
            return;
          }
        }
        {
          std::lock_guard lock(mu_);
          if (stopping_ || broken_) {
            reading_ = false;
            return;
          }
        }
        if (!read_frame(raw)) {
          release_reading_role();
          return;
        }
        hot_until = lone_answered() ? Clock::now() + kTcpHotTime : Clock::time_point{};
      }
      release_reading_role();
    }
  }

  // Reads one answer frame and acts on it (a frame has started: the rest follows promptly
  // from a live peer). False: the lane failed (fail_all done).
  bool read_frame(std::array<std::byte, kTcpHeaderBytes>& raw) {
    Status s = read_input(raw, Clock::now() + frame_rest_timeout_);
    if (s.ok()) s = on_frame(raw.data());
    if (s.ok()) return true;
    fail_all(s.code() == StatusCode::kProtocolError ? s : lost(s));
    return false;
  }

  // Receives what has come into the empty input buffer without waiting: 1 some came, 0
  // nothing yet, -1 the lane failed (fail_all done). A hot wait spins on this rather than on
  // poll(), so the answer to a lone request is in hand after one system call instead of two.
  // At most kDirectReceiveBytes: a small READ payload lands in the buffer anyway, and the
  // rest of a larger one still goes straight into its target (read_input_scatter).
  int receive_now() {
    const ssize_t n = ::recv(fd_.get(), input_.get(), kDirectReceiveBytes, MSG_DONTWAIT);
    if (n > 0) {
      last_input_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
      in_pos_ = 0;
      in_end_ = static_cast<size_t>(n);
      return 1;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return 0;
    fail_all(lost(n == 0 ? PeerDisconnected("connection closed by peer")
                         : ErrnoStatus(StatusCode::kPeerDisconnected, "recv", errno)));
    return -1;
  }

  Status lost(const Status& why) const {
    return PeerDisconnected("connection to " + peer_ + " lost: " + why.message());
  }

  Status on_frame(const std::byte* raw) {
    KVF_ASSIGN_OR_RETURN(TcpHeader h, decode_tcp_header(raw));
    if (h.type != TcpFrame::kAck && h.type != TcpFrame::kReadData) {
      return ProtocolError(fmt::format("peer {} sent frame type {} on a data lane", peer_,
                                       static_cast<int>(h.type)));
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
      return ProtocolError(
          fmt::format("peer {} answered request {} with frame type {} and length {}", peer_,
                      h.request_id, static_cast<int>(h.type), h.length));
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

  // The answer to a request failed at its deadline: checked like any answer, and a READ's
  // payload drained, never landed.
  Status absorb_late_answer(const TcpHeader& h, const ExpiredRequest& e) {
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

  // Reads a READ's payload into local memory (a vector frame's into each of its pieces in
  // turn), at most kTcpReceivePieceBytes at a time; once the batch is stopped the rest is
  // drained, never written.
  Status receive_read_payload(TcpChunk& c) {
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

  // Reads a READ's payload for device memory into the reader's staging buffer for that
  // device, and copies each buffer-full to the device (waiting for the copy) before reading
  // on: the chunk completes only after its last copy. A copy runs only while the batch may
  // proceed (checked under a CopyGuard), so nothing lands after stop(); once stopped or
  // failed, the rest of the payload is drained.
  Status receive_read_into_device(TcpChunk& c) {
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
          outcome =
              (*lander)->land(c.local + (done - staged), staged, std::exchange(after, nullptr));
        }
        staged = 0;
      }
    }
    return outcome;
  }

  Fd fd_;
  std::string peer_;
  int64_t clock_offset_ns_;
  std::chrono::milliseconds frame_rest_timeout_;  // TcpLinkOptions::frame_rest_timeout
  TcpLanderSet landers_;                          // reader thread only
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<TcpChunk> queue_;                        // guarded by mu_
  std::unordered_map<uint64_t, TcpChunk> in_flight_;  // guarded by mu_
  bool broken_ = false;                               // guarded by mu_
  bool stopping_ = false;                             // guarded by mu_
  Status broken_status_;                              // guarded by mu_
  // Requests failed at their deadline whose answers are still due (guarded by mu_).
  std::unordered_map<uint64_t, ExpiredRequest> expired_;
  // When the peer last sent us anything (Clock ticks).
  std::atomic<Clock::rep> last_input_{Clock::now().time_since_epoch().count()};
  uint64_t next_id_ = 1;  // guarded by mu_
  bool sending_ = false;  // guarded by mu_: someone holds the sending role
  // Most requests in flight at once since the lane was last idle (guarded by mu_).
  size_t peak_in_flight_ = 0;
  // A request that was part of a larger part was carried since the lane was last idle
  // (guarded by mu_).
  bool shared_since_idle_ = false;
  // A request whose answer a waiter reads was carried since the lane was last idle (mu_).
  bool waiter_read_since_idle_ = false;
  // The reading role (guarded by mu_): someone reads the lane's input (the reader thread or
  // a waiter, read_for); only its holder touches the input buffer and the landers.
  bool reading_ = false;
  bool reader_asleep_ = false;           // guarded by mu_: the reader thread waits on reader_cv_
  Clock::time_point last_registered_{};  // guarded by mu_: the last request sent
  std::condition_variable reader_cv_;
  // The sending role's scratch (only its holder touches them).
  std::vector<std::array<std::byte, kTcpHeaderBytes>> headers_ =
      std::vector<std::array<std::byte, kTcpHeaderBytes>>(kMaxGather);
  std::vector<iovec> iov_;
  std::vector<SentFrame> frames_;
  std::deque<BatchProgress::CopyGuard> copy_guards_;  // held across one sendmsg
  std::vector<uint64_t> sent_ids_;
  std::vector<std::byte> tables_;  // vector frames' tables, encoded
  // The reader's scratch: the ranges of a READ payload being received.
  std::vector<iovec> read_window_;
  // The reader's input buffer: [in_pos_, in_end_) is received and not yet consumed.
  std::unique_ptr<std::byte[]> input_ = std::make_unique<std::byte[]>(kReaderBufferBytes);
  size_t in_pos_ = 0;
  size_t in_end_ = 0;
  std::thread sender_;
  std::thread reader_;
};

Result<std::shared_ptr<TcpLane>> TcpLane::connect(const TcpLinkOptions& o,
                                                  Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(o.endpoint, deadline));
  std::array<std::byte, kTcpHeaderBytes> raw{};
  TcpHeader hello;
  hello.type = TcpFrame::kHello;
  const auto t_sent = Clock::now();
  hello.deadline_ns = to_ns(t_sent);
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
  const int64_t offset_ns = ack->deadline_ns - to_ns(t_received);
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
  return std::shared_ptr<TcpLane>(
      new TcpLane(std::move(fd), o.peer_name, offset_ns, o.frame_rest_timeout, o.device));
}

TcpLink::TcpLink(TcpLinkOptions options) : options_(std::move(options)) {
  lanes_.resize(std::max(1, options_.lanes));
  connecting_.resize(lanes_.size(), false);
}

TcpLink::~TcpLink() = default;

Result<std::shared_ptr<TcpLane>> TcpLink::lane(size_t index, Clock::time_point batch_deadline) {
  std::unique_lock lock(mu_);
  const auto usable = [&] { return lanes_[index] && !lanes_[index]->broken(); };
  // One caller connects a lane at a time, without the lock; the others wait for it, each
  // only until its own batch's deadline.
  while (connecting_[index] && !usable()) {
    if (lanes_cv_.wait_until(lock, batch_deadline) == std::cv_status::timeout &&
        connecting_[index] && !usable()) {
      return Timeout("tcp lane to " + options_.peer_name +
                     " still connecting at the batch deadline");
    }
  }
  if (usable()) return lanes_[index];
  const bool had_connection = lanes_[index] != nullptr;
  connecting_[index] = true;
  lock.unlock();
  const Clock::time_point own_deadline = Clock::now() + options_.connect_timeout;
  const bool batch_bounded = batch_deadline < own_deadline;
  auto fresh = TcpLane::connect(options_, std::min(own_deadline, batch_deadline));
  lock.lock();
  connecting_[index] = false;
  if (fresh.ok()) lanes_[index] = *fresh;
  lock.unlock();
  lanes_cv_.notify_all();
  if (fresh.ok()) return std::move(*fresh);
  // The batch's deadline cut the connection short: its timeout, not a verdict on the peer
  // (the next batch tries again).
  if (batch_bounded && Clock::now() >= batch_deadline &&
      fresh.status().code() == StatusCode::kPeerUnreachable) {
    return Timeout("tcp lane to " + options_.peer_name +
                   " not connected before the batch deadline: " + fresh.status().message());
  }
  // A peer we were connected to and cannot reach again is gone, not "unreachable".
  if (had_connection && fresh.status().code() == StatusCode::kPeerUnreachable) {
    return PeerDisconnected("lost the connection to " + options_.peer_name +
                            " and cannot reconnect: " + fresh.status().message());
  }
  return fresh.status();
}

size_t TcpLink::quiet_lane() {
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i] ? lanes_[i]->idle() : !connecting_[i]) return i;
    }
  }
  return next_lane_.fetch_add(1);
}

void TcpLink::shutdown() {
  std::lock_guard lock(mu_);
  for (auto& lane : lanes_) lane.reset();  // each lane fails what it carries and joins
}

Result<TcpDeviceStager*> TcpLink::stager() {
  std::lock_guard lock(stager_mu_);
  if (stager_) return stager_.get();
  if (!options_.device || !options_.device->built()) {
    return NotSupported("tcp to " + options_.peer_name +
                        ": this build has no CUDA, so device memory cannot be staged");
  }
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, options_.device->api());
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<TcpStagingPool> pool, options_.device->pool());
  stager_ = std::make_unique<TcpDeviceStager>(std::move(api), std::move(pool));
  return stager_.get();
}

namespace {

bool is_device(const RegionEntry* r) {
  return r != nullptr && r->location.kind == MemoryLocation::Kind::kCuda;
}

// A waiting thread reads its batch's answers on the lane its part was sent on (read_for).
// Owned by the batch, which it points at without owning.
class TcpWaitReader final : public BatchHelper {
 public:
  TcpWaitReader(const std::shared_ptr<TcpLane>& lane, const BatchProgress* batch)
      : lane_(lane), batch_(batch) {}
  void help(Clock::time_point until) override {
    if (std::shared_ptr<TcpLane> lane = lane_.lock()) lane->read_for(batch_, until);
  }

 private:
  std::weak_ptr<TcpLane> lane_;
  const BatchProgress* batch_;
};

}  // namespace

Status TcpLink::post(const BatchPart& part) {
  const size_t lane_count = lanes_.size();
  // Which spans read this engine's device memory (WRITEs, staged by the stager), which land
  // in it (READs, landed by the lane's reader, a buffer-full at a time), and which read the
  // peer's (its receiver stages them). Staged ones are cut at the staging buffer size.
  std::vector<int> source_device(part.spans.size(), -1);
  std::vector<int> target_device(part.spans.size(), -1);
  std::vector<bool> device_sized(part.spans.size(), false);
  // Which spans may go in a vector frame: host memory on both sides (device memory moves in
  // one-range frames only, staged on either side).
  std::vector<bool> packable(part.spans.size(), false);
  bool any_device = false;
  size_t local_hint = 0;
  size_t remote_hint = 0;
  for (size_t i = 0; i < part.spans.size(); ++i) {
    const ResolvedOp& op = part.spans[i];
    if (!part.touches_device) {  // host memory on both sides: no region to look up
      packable[i] = op.length <= kVecOpBytes;
      continue;
    }
    const RegionEntry* l =
        part.local == nullptr
            ? nullptr
            : part.local->find(reinterpret_cast<uint64_t>(op.local), op.length, local_hint);
    const RegionEntry* r = part.remote == nullptr
                               ? nullptr
                               : part.remote->find(op.remote_addr, op.length, remote_hint);
    // A READ of the peer's device memory must fit the peer's staging (answered whole).
    device_sized[i] = op.kind == OpKind::kRead ? is_device(r) : is_device(l);
    if (op.kind == OpKind::kRead && is_device(l)) {
      target_device[i] = l->location.device;
    } else if (is_device(l)) {
      source_device[i] = l->location.device;
      any_device = true;
    }
    packable[i] = op.length <= kVecOpBytes && !is_device(l) && !is_device(r);
  }
  const bool any_landing =
      std::any_of(target_device.begin(), target_device.end(), [](int d) { return d >= 0; });
  if (any_landing) {
    // Checked here, so that nothing is queued when landing cannot work.
    if (!options_.device || !options_.device->built()) {
      return NotSupported("tcp to " + options_.peer_name +
                          ": this build has no CUDA, so a READ cannot land in device memory");
    }
    KVF_RETURN_IF_ERROR(options_.device->api().status());
  }
  TcpDeviceStager* device_stager = nullptr;
  uint64_t staging_bytes = options_.device ? options_.device->buffer_bytes() : kTcpChunkBytes;
  if (any_device) {
    KVF_ASSIGN_OR_RETURN(device_stager, stager());
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<TcpStagingPool> pool, options_.device->pool());
    staging_bytes = pool->buffer_bytes();
  }
  // after_cuda_event orders device copies; a part that reads no local device memory has none
  // to order (another part of the batch may, e.g. on cuda_ipc).
  std::vector<std::vector<TcpChunk>> per_lane(lane_count);
  // Device chunks in op order: the lane each goes to, and the device it reads.
  struct StagedChunk {
    size_t lane = 0;
    int device = 0;
    TcpChunk chunk;
  };
  std::vector<StagedChunk> staged_chunks;
  size_t chunks = 0;
  // A part of up to kOneLaneBytes goes on one lane (quiet_lane); larger ones are cut finer so
  // that every lane carries a share of them, but in at least two chunks of at most
  // kStripeChunkBytes each: a part of 1–4 MiB keeps to two (or few) lanes rather than waking
  // four.
  const bool one_lane = part.bytes <= kOneLaneBytes;
  size_t next = one_lane ? quiet_lane() : next_lane_.fetch_add(1);
  const uint64_t least_chunk =
      std::clamp<uint64_t>((part.bytes + 1) / 2, kTcpMinChunkBytes, kStripeChunkBytes);
  const uint64_t chunk_bytes =
      one_lane ? std::max(part.bytes, kTcpMinChunkBytes)
               : std::clamp<uint64_t>(part.bytes / lane_count, least_chunk, kTcpChunkBytes);
  const size_t first_lane = next % lane_count;
  auto lane_for_chunk = [&] { return one_lane ? first_lane : next++ % lane_count; };
  std::vector<bool> lane_used(lane_count, false);
  // The vector frame being packed: consecutive small ops of one kind, up to kVecMaxEntries
  // and chunk_bytes. A group of one goes as a plain frame (a lone op keeps its fast path).
  TcpChunk group;
  auto close_group = [&] {
    if (group.pieces.empty()) return;
    if (group.pieces.size() == 1) group.pieces.clear();  // local/remote/length are the op's
    const size_t lane_index = lane_for_chunk();
    lane_used[lane_index] = true;
    per_lane[lane_index].push_back(std::move(group));
    ++chunks;
    group = TcpChunk{};
  };
  for (size_t i = 0; i < part.spans.size(); ++i) {
    const ResolvedOp& op = part.spans[i];
    if (packable[i] && op.length != 0) {
      if (!group.pieces.empty() &&
          (group.kind != op.kind || group.pieces.size() == kVecMaxEntries ||
           group.length + op.length > chunk_bytes)) {
        close_group();
      }
      if (group.pieces.empty()) {
        group.batch = part.batch;
        group.kind = op.kind;
        group.local = op.local;
        group.remote_addr = op.remote_addr;
      }
      group.pieces.push_back({op.local, op.remote_addr, op.length});
      group.length += op.length;
      continue;
    }
    close_group();
    const bool staged = source_device[i] >= 0;
    const uint64_t step = device_sized[i] ? std::min(chunk_bytes, staging_bytes) : chunk_bytes;
    for (uint64_t off = 0; off < op.length; off += step) {
      uint64_t n = std::min(step, op.length - off);
      TcpChunk chunk;
      chunk.batch = part.batch;
      chunk.kind = op.kind;
      chunk.local = op.local + off;
      chunk.remote_addr = op.remote_addr + off;
      chunk.length = n;
      chunk.local_device = target_device[i];
      // Every landing chunk waits for the event: they land on several lanes' streams.
      if (target_device[i] >= 0) chunk.after_event = part.after_cuda_event;
      const size_t lane_index = lane_for_chunk();
      lane_used[lane_index] = true;
      if (staged) {
        staged_chunks.push_back({lane_index, source_device[i], std::move(chunk)});
      } else {
        per_lane[lane_index].push_back(std::move(chunk));
      }
      ++chunks;
    }
  }
  close_group();
  if (chunks == 1 && staged_chunks.empty()) {
    for (auto& lane_chunks : per_lane) {
      for (TcpChunk& c : lane_chunks) c.sole = true;
    }
  }
  std::vector<std::shared_ptr<TcpLane>> targets(lane_count);
  for (size_t i = 0; i < lane_count; ++i) {
    if (!lane_used[i]) continue;
    KVF_ASSIGN_OR_RETURN(targets[i], lane(i, part.batch->deadline()));
  }
  part.batch->add_tasks(static_cast<int>(chunks));
  // Device chunks go to the stager in op order; it hands each to its lane once the chunk is
  // in a staging buffer.
  if (device_stager != nullptr) {
    std::vector<DeviceStageJob> jobs;
    jobs.reserve(staged_chunks.size());
    for (StagedChunk& sc : staged_chunks) {
      DeviceStageJob job;
      job.batch = part.batch;
      job.device_src = sc.chunk.local;
      job.length = sc.chunk.length;
      job.device = sc.device;
      job.after_event = jobs.empty() ? part.after_cuda_event : nullptr;
      job.deliver = [weak_lane = std::weak_ptr<TcpLane>(targets[sc.lane]),
                     chunk = std::make_shared<TcpChunk>(std::move(sc.chunk)),
                     peer = options_.peer_name](Result<StagingLease> staged) {
        std::shared_ptr<TcpLane> lane = weak_lane.lock();
        if (staged.ok() && !lane) staged = PeerDisconnected("tcp link to " + peer + " was closed");
        if (!staged.ok()) {
          chunk->batch->finish_task(staged.status());
          return;
        }
        chunk->local = staged->data();
        chunk->staging = std::move(*staged);
        std::vector<TcpChunk> one;
        one.push_back(std::move(*chunk));
        lane->enqueue(one, false);
      };
      jobs.push_back(std::move(job));
    }
    device_stager->enqueue(std::move(jobs));
  }
  // At most one lane sends on this thread, after the others are handed to their sender
  // threads (which run meanwhile), and only a small share (or a one-lane part): a large one
  // would keep the caller in sendmsg.
  size_t here = lane_count;
  for (size_t i = 0; i < lane_count; ++i) {
    uint64_t lane_bytes = 0;
    for (const TcpChunk& c : per_lane[i]) lane_bytes += c.length;
    if (!per_lane[i].empty() && (one_lane || lane_bytes <= kInlineSendBytes)) {
      here = i;
      break;
    }
  }
  for (size_t i = 0; i < lane_count; ++i) {
    if (!per_lane[i].empty() && i != here) targets[i]->enqueue(per_lane[i], false);
  }
  if (here != lane_count) {
    // A one-lane part in host memory: the thread that waits for the batch reads its answers.
    const bool waiter_reads = one_lane && !any_device && !any_landing;
    if (waiter_reads) {
      part.batch->add_helper(std::make_shared<TcpWaitReader>(targets[here], part.batch.get()));
    }
    targets[here]->enqueue(per_lane[here], true, waiter_reads);
  }
  part.batch->mark_posted();
  return Status::Ok();
}

}  // namespace kvferry::detail
