// TcpLane: one connection of a TcpLink (tcp_link.h) to the peer's receiver, which sends request
// frames (and WRITE payloads straight from local memory) and reads the answers (acks, READ
// payloads); and the request chunks (TcpChunk) and the constants the link and its lanes share.
// Private to the tcp transport: tcp_lane.cc connects a lane, tends it and fails or expires
// what it carries, tcp_lane_send.cc sends, tcp_lane_receive.cc reads the answers, tcp_link.cc
// cuts a part into chunks for the lanes.
//
// A lane has no thread of its own. Two roles use its socket, each held by one thread at a
// time: sending (sending_), by the posting thread of a small part on an idle lane, else by a
// turn on the transport's I/O pool (TcpLaneService); and reading (reading_), by the thread
// waiting for a batch whose answer is due here (read_for), else by a turn on the pool, started
// when a request is sent that no waiter reads, or when the connection turns readable while
// nobody holds the role (the pool watches it then), or by the lane's tending. Between turns,
// a lane that waits for answers or sits idle is only a descriptor in the pool's epoll set.
//
// Owned by its TcpLink (shared_ptr; a waiter reading its batch's answers holds a weak_ptr, a
// turn on the pool a shared_ptr).
// Thread-safety: broken(), idle(), enqueue(), read_for(), tend() and close() may be called
// from any thread; the sending and reading roles decide who uses the socket.
#pragma once

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/io_pool.h"
#include "core/spin_gate.h"
#include "transport/tcp/tcp_device_lander.h"
#include "transport/tcp/tcp_lane_service.h"
#include "transport/tcp/tcp_link.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry::detail {

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
  // role): no reading turn starts for it until kWaiterReadGrace after it was sent.
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
inline constexpr size_t kMaxGather = 512;
// A lane that is idle sends a post's chunks on the posting thread when they are at most this
// many bytes: the socket buffer takes them at once, and the hand-off to a sending turn on the
// pool (a wake-up, tens of microseconds on a busy machine) is the largest cost of a small op.
inline constexpr uint64_t kInlineSendBytes = uint64_t{256} << 10;
// A part of at most this many bytes goes on one lane (as one frame when its ops pack), sent on
// the posting thread, and its answer is read by the thread that waits for the batch (see
// TcpLane::read_for): one receiver, one sender, and two wake-ups per batch, as in a plain
// stream. Split over two lanes it crossed six threads.
inline constexpr uint64_t kOneLaneBytes = uint64_t{512} << 10;
// A larger part is striped over the lanes in chunks of at least this many bytes (or half the
// part, if that is less): with four lanes, a 1 MiB READ cut in four 256 KiB chunks woke four
// readers and took longer than two chunks of 512 KiB (docs/TRANSPORTS.md "tcp lanes").
inline constexpr uint64_t kStripeChunkBytes = uint64_t{1} << 20;
// How long an answer is left to the posting thread's wait: a batch that nobody waits for nor
// polls (status() takes in what has arrived) is read by a reading turn after this. Each
// request asks the pool's timer for this, so a shorter grace wakes a pool thread more often
// while requests flow: at 1 ms, a stream of single 4 KiB ops woke one most milliseconds, and
// those wake-ups made about half the ops slower than 3x the p50 on a quiet machine.
inline constexpr std::chrono::milliseconds kWaiterReadGrace{10};
// A lane without a request for this long is idle: the pool watches its connection (for its
// peer closing it) and it is no longer tended. While it carries requests it is tended this
// often (their batches' deadlines).
inline constexpr std::chrono::milliseconds kReaderIdleSleep{50};
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
inline constexpr size_t kReaderBufferBytes = size_t{64} << 10;
inline constexpr size_t kDirectReceiveBytes = size_t{16} << 10;
// A READ payload is received straight into at most this many pieces per recvmsg: a whole
// vector frame's (kVecMaxEntries), so none of its bytes land in the buffer to be copied again.
inline constexpr size_t kMaxReceivePieces = 256;
// Consecutive ops of a part of at most kVecOpBytes each (host memory on both sides, same
// kind) are packed into one vector frame of at most kVecMaxEntries entries and the part's
// chunk size: one header, one request entry and one ack for all of them. 256 KiB takes in
// one deepseek-v3 page (72 KiB), which at 64 KiB went as a frame and an ack each (A/B, 9
// pairs: WRITE 72 KiB x 128 / plain stream 1.28 -> 1.42, READ 1.15 -> 1.27).
inline constexpr uint64_t kVecOpBytes = uint64_t{256} << 10;
inline constexpr size_t kVecMaxEntries = 256;
static_assert(kVecMaxEntries <= kTcpMaxVecEntries);
static_assert(kVecMaxEntries <= kMaxReceivePieces);
// A lane whose peer shows no life (nothing received, nothing sent) is closed only once every
// batch on it is this far past its deadline: until then a stopped peer may resume and serve
// the batches that still have time.
inline constexpr std::chrono::milliseconds kLaneGrace{100};

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

class TcpLane : public std::enable_shared_from_this<TcpLane> {
 public:
  // Connects and runs the tcp handshake, all of it before `deadline`.
  static Result<std::shared_ptr<TcpLane>> connect(const TcpLinkOptions& o,
                                                  Clock::time_point deadline);
  ~TcpLane();

  bool broken() const {
    std::lock_guard lock(mu_);
    return broken_;
  }

  // Whether this lane must take no more requests: broken, or, while it carries nothing,
  // about to be closed or closed by its peer. A receiver closes a connection idle past its
  // idle timeout, and a request sent as it does is lost with the connection. So a lane idle
  // for half the timeout its receiver announced (kHelloAck) is retired here, before the
  // receiver's close can cross a request; and after any quiet spell (kReaderIdleSleep) one
  // non-blocking peek looks for a close the pool's watch has not handled yet. A stale lane is
  // failed (it carries nothing) and the caller connects a fresh one.
  bool stale();

  // Nothing is queued, being sent or waiting for its answer here.
  bool idle() const {
    std::lock_guard lock(mu_);
    return !broken_ && !sending_ && queue_.empty() && in_flight_.empty();
  }

  // Queues the chunks for a sending turn on the pool, or, when `send_here_if_idle` and nobody
  // is sending on this lane, sends them on the calling thread (and, with `waiter_reads`,
  // leaves their answers to that thread's wait for the batch: read_for).
  void enqueue(std::vector<TcpChunk>& chunks, bool send_here_if_idle, bool waiter_reads = false) {
    bool send_here = false;
    bool start_turn = false;
    {
      std::lock_guard lock(mu_);
      if (!broken_ && !stopping_) {
        if (send_here_if_idle && !sending_ && queue_.empty() && chunks.size() <= kMaxGather) {
          sending_ = true;
          send_here = true;
        } else {
          for (TcpChunk& c : chunks) queue_.push_back(std::move(c));
          chunks.clear();
          start_turn = !std::exchange(sending_, true);
        }
      }
    }
    if (send_here) {
      for (TcpChunk& c : chunks) c.waiter_reads = waiter_reads;
      send_turn_ = false;
      send_chunks(chunks);
      release_sending();
      return;
    }
    if (start_turn) post_send_turn();
    // A lane that broke meanwhile fails what it was given.
    for (TcpChunk& c : chunks) finish(c, broken_status());
  }

  // Closes the connection: everything queued or in flight fails (PeerDisconnected), and a
  // turn under way ends. For the link that drops the lane; a turn may hold it a little longer.
  void close();

  // Run by the service at the time the lane asked for (want_tending_locked): starts a reading
  // turn for answers a waiter left past kWaiterReadGrace, fails requests past their batch's
  // deadline while nobody reads, and has the pool watch a lane gone quiet. Returns when it
  // wants to run next (time_point::max(): not until it asks again).
  Clock::time_point tend(Clock::time_point now);

 private:
  TcpLane(Fd fd, std::string peer, int64_t offset_ns, std::chrono::milliseconds frame_rest_timeout,
          std::chrono::milliseconds peer_idle_timeout, std::shared_ptr<TcpDeviceStaging> device,
          std::shared_ptr<TcpLaneService> service);

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
  void fail_all(const Status& why, bool sender_gone = false);

  // Why a chunk fails when the lane is lost (`why`): for its own batch's reason when it has
  // one (its deadline passed, it was cancelled); otherwise the lane's loss is a
  // disconnection for it, even when the lane died of another batch's timeout.
  Status loss_status(const TcpChunk& c, const Status& why) const;

  // Gives up the sending role, or hands it to a sending turn for what was queued meanwhile.
  void release_sending() {
    bool more = false;
    {
      std::lock_guard lock(mu_);
      more = !queue_.empty() && !broken_ && !stopping_;
      sending_ = more;
    }
    if (more) post_send_turn();
  }

  void post_send_turn() {
    service_->pool().post([self = shared_from_this()] { self->send_turn(); });
  }

  // A sending turn: sends what is queued until the queue is empty, then gives up the role.
  void send_turn();

  // Registers the chunks as in flight and sends them in one gathered sendmsg (or as few as
  // the socket needs). Only the holder of the sending role calls it. False: the lane broke
  // (everything on it has been failed).
  bool send_chunks(std::vector<TcpChunk>& chunks);

  void post_read_turn() {
    service_->pool().post([self = shared_from_this()] { self->read_turn(); });
  }

  // Marks the requests as sent (their sendmsg has returned: nothing reads their memory
  // any more); those already acknowledged complete now, and on a lane that broke meanwhile
  // the others fail now (fail_all left them to this thread).
  void finish_sent(const std::vector<uint64_t>& ids);

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
  Clock::time_point latest_deadline() const;

  // Deals with the frames of this send (frames_) whose batch's deadline has passed, with
  // `sent` bytes of the stream out: past the deadline nothing more is read from local
  // memory (stop() may have released it). A frame not started yet is dropped; a WRITE frame
  // partly sent is finished with zeros in place of the rest of its payload (the receiver,
  // past the same deadline on its clock, drains them and acks Timeout) and its answer is
  // absorbed when it comes; either way its chunk fails now. Returns the next deadline to
  // watch.
  Clock::time_point expire_frames(std::vector<iovec>& iov, size_t first, uint64_t sent,
                                  Clock::time_point now);

  // Sends the iovecs of frames_. A batch's deadline passing mid-send fails that batch's
  // frames (expire_frames) and the others go on. The lane gives up (Timeout) only when no
  // byte went out for kLaneGrace and every batch on the lane is kLaneGrace past its deadline;
  // on the posting thread, once the frames it sends are (it must not be held for others).
  Status send_iov(std::vector<iovec>& iov);

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
  bool expire_overdue();

  // Fills `out` from the input buffer, then from the socket (large remainders straight into
  // `out`, with what follows into the buffer), until `deadline`.
  Status read_input(std::span<std::byte> out, Clock::time_point deadline) {
    iovec one{out.data(), out.size()};
    return read_input_scatter({&one, 1}, deadline);
  }

  // The same for many ranges, filled in order; the iovecs are consumed (advanced) as they
  // fill. The socket's bytes go straight into up to kMaxReceivePieces ranges per recvmsg
  // when at least kDirectReceiveBytes are still wanted.
  Status read_input_scatter(std::span<iovec> parts, Clock::time_point deadline);

  // True once, when the lane has just gone idle after carrying a single request that a
  // reading turn answered (a waiter that reads its own answers waits hot itself).
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
  // nobody else reads and the batch has a request in flight here, reads the lane's answers on
  // this thread (those of other batches too) until the batch has none left here, or `until`.
  // So the answer wakes the waiter itself, not a reading turn that would then wake it.
  // Landing in device memory is left to reading turns.
  void read_for(const BatchProgress* batch, Clock::time_point until);

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

  // Whether a reading turn must read: a request is in flight that no waiter reads, or one
  // left to a waiter past kWaiterReadGrace. mu_ held.
  bool must_read_locked(Clock::time_point now) const {
    for (const auto& [id, c] : in_flight_) {
      if (!c.waiter_reads || now >= c.sent_at + kWaiterReadGrace) return true;
    }
    return false;
  }

  // Gives up the reading role (a waiter's), or hands it to a reading turn when there is
  // something to read.
  void release_reading_role();

  // A reading turn: holds the reading role (taken for it) and reads answers while they come
  // (hot for a while after a lone one), then gives the role up (end_reading_turn).
  void read_turn();

  // The end of a reading turn, with nothing received: gives up the role, and has the pool
  // watch the connection if an answer is still due that no waiter reads.
  void end_reading_turn();

  // The pool's watch saw the connection readable (or closed): a reading turn, here, unless
  // someone holds the role.
  void on_ready();

  // Asks the service to run tend() by `when` (never later than already asked). mu_ held.
  void want_tending_locked(Clock::time_point when);

  // When the lane next needs tend(): the end of a waiter's grace, the next look at its batches'
  // deadlines while it carries anything, or the moment it counts as idle (to be watched).
  // mu_ held.
  Clock::time_point next_tend_locked(Clock::time_point now) const;

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

  // One poll of a hot wait: receive_now, timed by the reading role's SpinGate, which ends the
  // spell when it stops paying; a poll that brought input settles it.
  int receive_hot() {
    const Clock::time_point began = Clock::now();
    const int got = receive_now();
    if (got == 0) spin_.keep_polling(began, Clock::now());
    if (got > 0) spin_.settle();
    return got;
  }

  Status lost(const Status& why) const {
    return PeerDisconnected("connection to " + peer_ + " lost: " + why.message());
  }

  Status on_frame(const std::byte* raw);

  // The answer to a request failed at its deadline: checked like any answer, and a READ's
  // payload drained, never landed.
  Status absorb_late_answer(const TcpHeader& h, const ExpiredRequest& e);

  // Reads a READ's payload into local memory (a vector frame's into each of its pieces in
  // turn), at most kTcpReceivePieceBytes at a time; once the batch is stopped the rest is
  // drained, never written.
  Status receive_read_payload(TcpChunk& c);

  // Reads a READ's payload for device memory into the reader's staging buffer for that
  // device, and copies each buffer-full to the device (waiting for the copy) before reading
  // on: the chunk completes only after its last copy. A copy runs only while the batch may
  // proceed (checked under a CopyGuard), so nothing lands after stop(); once stopped or
  // failed, the rest of the payload is drained.
  Status receive_read_into_device(TcpChunk& c);

  Fd fd_;
  std::string peer_;
  int64_t clock_offset_ns_;
  std::chrono::milliseconds frame_rest_timeout_;  // TcpLinkOptions::frame_rest_timeout
  TcpLanderSet landers_;                          // the reading role's
  std::shared_ptr<TcpLaneService> service_;
  // The pool's watch of fd_ (set once, by connect): declared after fd_, destroyed before it.
  std::unique_ptr<IoPool::Watch> watch_;
  mutable std::mutex mu_;
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
  // The reading role (guarded by mu_): someone reads the lane's input (a reading turn, from
  // the moment it is posted, or a waiter, read_for); only its holder touches the input
  // buffer and the landers.
  bool reading_ = false;
  SpinGate spin_;      // the reading role's (whoever holds it): polls only while polling pays
  bool armed_ = true;  // guarded by mu_: the watch fires when the connection turns readable
  Clock::time_point last_registered_{};  // guarded by mu_: the last request sent
  const Clock::time_point connected_at_ = Clock::now();
  // Half the receiver's idle timeout (zero: it has none): an idle lane is retired after it.
  const Clock::duration retire_after_;
  // Guarded by mu_: the time tend() was asked for (max: none), and whether the service lists
  // the lane.
  Clock::time_point tend_at_ = Clock::time_point::max();
  bool listed_ = false;
  // The sending role's scratch (only its holder touches them). send_turn_: held by a sending
  // turn on the pool (not a posting thread, which waits only for its own frames).
  bool send_turn_ = false;
  // Neither this nor input_ below is zeroed: a page is memory only once something is written
  // there, so a lane that carries a frame or a few at a time holds a page of each, not 24 +
  // 64 KiB, at every one of thousands of peers (docs/SCALING.md, memory per peer).
  std::unique_ptr<std::array<std::byte, kTcpHeaderBytes>[]> headers_ =
      std::make_unique_for_overwrite<std::array<std::byte, kTcpHeaderBytes>[]>(kMaxGather);
  std::vector<iovec> iov_;
  std::vector<SentFrame> frames_;
  std::deque<BatchProgress::CopyGuard> copy_guards_;  // held across one sendmsg
  std::vector<uint64_t> sent_ids_;
  std::vector<std::byte> tables_;  // vector frames' tables, encoded
  // The reader's scratch: the ranges of a READ payload being received.
  std::vector<iovec> read_window_;
  // The reader's input buffer: [in_pos_, in_end_) is received and not yet consumed.
  std::unique_ptr<std::byte[]> input_ =
      std::make_unique_for_overwrite<std::byte[]>(kReaderBufferBytes);
  size_t in_pos_ = 0;
  size_t in_end_ = 0;
};

}  // namespace kvferry::detail
