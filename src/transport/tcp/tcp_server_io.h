// TcpServer::IoThread: one of the tcp receiver's I/O threads (tcp_server.h), which serves its
// connections (Conn) with epoll, and the state each connection keeps: the frame being received,
// the pins on the registered memory it targets, the replies queued for it (OutPiece).
// Private to the tcp transport: tcp_server.cc runs the threads and the connections' lifetime
// and limits, tcp_server_receive.cc receives and acts on frames, tcp_server_reply.cc sends the
// replies and the answers of device READs.
//
// Thread-safety: adopt() may be called from any thread (the acceptor's); everything else runs
// on the I/O thread.
#pragma once

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/auth.h"
#include "core/log_throttle.h"
#include "core/spin_gate.h"
#include "transport/batch_progress.h"
#include "transport/peer_liveness.h"
#include "transport/tcp/tcp_device_lander.h"
#include "transport/tcp/tcp_device_reader.h"
#include "transport/tcp/tcp_server.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry {

// How long a refused connection is kept half-closed, discarding input, before it is closed.
inline constexpr int64_t kRefusedDrainNs = 1'000'000'000;
// Input is received into a per-connection buffer of this size, so one recv() brings in many
// small frames (headers, acks, small payloads) at once; payload bytes found there are copied
// to their target (through the kernel, one system call per copy, so registered memory the
// application unmapped is an error, not a crash: core/own_memory.h). A payload with at least
// kDirectReceiveBytes still to come is received straight into its target instead, together
// with whatever follows it into the buffer. After a kWrite that large the next frame is
// likely one too, so the buffer takes in no more than its header: its payload then goes
// straight to its target as well, never through the buffer (a lone 64 KiB write came in
// with its header, was copied again, and took two more system calls for its last 48 bytes).
inline constexpr size_t kInputBufferBytes = size_t{64} << 10;
inline constexpr uint64_t kDirectReceiveBytes = uint64_t{16} << 10;
// Output pieces gathered into one sendmsg(); acknowledgements are flushed once at least this
// many are queued while input keeps coming, and always when input runs dry (a lone request
// is never kept waiting for company).
inline constexpr size_t kMaxOutPieces = 256;
inline constexpr size_t kAckFlushPieces = 32;
// A vector frame's payload is received straight into at most this many entries per recvmsg.
inline constexpr size_t kMaxReceiveEntries = 64;
// How often an I/O thread looks for connections past a deadline, an idle or a stall limit,
// while any connection is under way (a frame, replies or a hello not done); an idle one is
// looked at when its idle timeout is due, and with none of either the thread sleeps.
inline constexpr int64_t kLimitCheckNs = 20'000'000;
inline constexpr int64_t kNoLimitCheck = std::numeric_limits<int64_t>::max();

// epoll_wait's timeout for a wake-up at steady-clock `at_ns` (-1: none), from `now_ns`.
inline int milliseconds_until(int64_t at_ns, int64_t now_ns) {
  if (at_ns == kNoLimitCheck) return -1;
  const int64_t ms = (std::max<int64_t>(at_ns - now_ns, 0) + 999'999) / 1'000'000;
  return static_cast<int>(std::min<int64_t>(ms, std::numeric_limits<int>::max()));
}

inline int64_t monotonic_ns() { return steady_ns(Clock::now()); }

// A registered range pinned for the duration of one request (see RegionUse).
struct Pin {
  std::shared_ptr<const RegionIndex> snapshot;
  RegionUse* use = nullptr;
  char* ptr = nullptr;
  int device = -1;  // device memory of this device (written through a TcpDeviceLander)

  void release() {
    if (use != nullptr) use->in_flight.fetch_sub(1);
    use = nullptr;
    snapshot.reset();
  }
};

inline void release_all(std::vector<Pin>& pins) {
  for (Pin& p : pins) p.release();
  pins.clear();
}

struct OutPiece {
  std::array<std::byte, kTcpHeaderBytes> header{};
  size_t header_sent = 0;        // kTcpHeaderBytes from the start: a piece without a header
  std::vector<std::byte> owned;  // small payloads (a nonce)
  const char* payload = nullptr;
  uint64_t payload_len = 0;
  uint64_t payload_sent = 0;
  Pin pin;                // keeps a kReadData source registered until sent
  std::vector<Pin> pins;  // the same for a kReadV's regions (on its last piece)
  StagingLease staging;   // a device READ's staged bytes (payload points into it)

  void release() {
    pin.release();
    release_all(pins);
  }
};

enum class InState { kHeader, kPayload, kDrain, kAuth, kTable, kVecPayload };

struct Conn {
  Fd fd;
  ConnectionSlot slot;  // its place against the listener's limits
  int64_t accepted_ns = 0;
  int64_t last_in_ns = 0;       // when input last arrived (accepted_ns before any)
  int64_t frame_began_ns = 0;   // when the current frame's first byte was taken in
  int64_t out_since_ns = 0;     // when queued output last made progress (or began to queue)
  bool reading_paused = false;  // max_queued_replies reached: EPOLLIN off until it drains
  uint32_t interest = EPOLLIN;  // the events epoll watches for it now
  InState in = InState::kHeader;
  bool large_writes = false;  // the last frame was a kWrite of at least kDirectReceiveBytes
  std::array<std::byte, kTcpHeaderBytes> header{};
  size_t header_have = 0;
  TcpHeader current;
  uint64_t remaining = 0;
  Status verdict;             // what the current kWrite will be acknowledged with
  uint64_t refused_addr = 0;  // the Ack's addr: the first entry of a vector frame refused
  Pin target;                 // the current kWrite's target
  // The current vector frame: its table as received, the decoded entries, each entry's
  // target and the pins of their regions; the entry being received and how much of it is in.
  std::vector<std::byte> table;
  size_t table_have = 0;
  std::vector<TcpVecEntry> entries;
  std::vector<char*> targets;
  std::vector<Pin> pins;
  size_t vec_index = 0;
  uint64_t vec_offset = 0;
  // A kWrite into device memory: its payload is received into the I/O thread's lander for
  // that device; `staged` bytes are there, `landed` bytes are already in device memory.
  TcpDeviceLander* lander = nullptr;
  uint64_t staged = 0;
  uint64_t landed = 0;
  std::deque<OutPiece> out;
  bool hello_done = false;
  bool authenticated = false;
  bool close_after_flush = false;
  int64_t drain_until_ns = 0;  // set once a refused connection is half-closed
  AuthNonce nonce{};
  std::array<std::byte, kTcpProofBytes> proof{};
  size_t proof_have = 0;
  // Device READs being staged for this connection (answered by take_staged_reads), and
  // what ends their staging when the connection goes.
  uint32_t serial = 0;
  uint32_t staging_reads = 0;
  std::shared_ptr<PeerLiveness> alive = std::make_shared<PeerLiveness>("a tcp initiator");
  // Received but not yet consumed: [in_pos, in_end) of input. Not zeroed: only the pages
  // that input reached are memory (headers alone, on a connection of large writes).
  std::unique_ptr<std::byte[]> input =
      std::make_unique_for_overwrite<std::byte[]>(kInputBufferBytes);
  size_t in_pos = 0;
  size_t in_end = 0;

  ~Conn() {
    alive->mark_disconnected("its connection closed");
    target.release();
    release_all(pins);
    for (OutPiece& p : out) p.release();
  }
};

struct TcpServer::IoThread {
  IoThread(const TcpServerOptions& options, RegionSource regions,
           std::shared_ptr<TcpDeviceReadService> reads);
  ~IoThread();
  // Starts the thread; Internal when it cannot start (core/named_thread.h).
  Status start();

  void adopt(Fd fd, ConnectionSlot slot);

 private:
  void signal() {
    signalled_.store(true, std::memory_order_release);  // a spell's direct polls ask epoll
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void loop();

  // Releases pins past their deadline, and closes connections that are past the hello
  // timeout, idle, or stalled (see tcp_server.h). When to look again (kNoLimitCheck: only
  // once something comes).
  int64_t enforce_limits(int64_t now);

  // One line per interval for connections closed because a frame took longer than
  // frame_rest_timeout as a whole (a trickle of bytes, or a peer that stopped mid-frame).
  void log_frame_overdue(const Conn& c, int64_t now);

  static int64_t nanoseconds(std::chrono::milliseconds d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  void take_incoming();

  void drop(int fd) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    conns_.erase(fd);
  }

  bool update_interest(Conn& c) {
    epoll_event ev{};
    // A refused connection acts on nothing more: it flushes its refusal, then half-closes
    // and discards what still arrives until the peer closes (or a second passes). Closing
    // with unread input would send a reset, which can overtake the refusal on a real link.
    const bool read = !c.reading_paused && !(c.close_after_flush && !c.out.empty());
    ev.events = (read ? static_cast<uint32_t>(EPOLLIN) : 0u) |
                (c.out.empty() ? 0u : static_cast<uint32_t>(EPOLLOUT));
    ev.data.fd = c.fd.get();
    if (c.close_after_flush && c.out.empty() && c.drain_until_ns == 0) {
      ::shutdown(c.fd.get(), SHUT_WR);
      c.drain_until_ns = monotonic_ns() + kRefusedDrainNs;
    }
    if (ev.events == c.interest) return true;  // a system call per request saved
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) return false;
    c.interest = ev.events;
    return true;
  }

  // Discards input on a refused, half-closed connection. False: it is done (close it).
  static bool discard_input(Conn& c);

  static void queue(Conn& c, const TcpHeader& h, OutPiece piece = {}) {
    encode_tcp_header(h, piece.header.data());
    if (c.out.empty()) c.out_since_ns = monotonic_ns();
    c.out.push_back(std::move(piece));
  }

  static void ack(Conn& c, uint64_t id, const Status& s, uint64_t addr = 0) {
    TcpHeader h;
    h.type = TcpFrame::kAck;
    h.request_id = id;
    h.addr = addr;
    h.status = static_cast<uint32_t>(s.code());
    queue(c, h);
  }

  // The verdict of a write refused by past_landing_deadline.
  static Status past_landing_deadline_status() {
    return Timeout(fmt::format(
        "write request within {} ms of its deadline on the receiver, or past it: no more of it "
        "lands",
        kLandingMarginNs / 1'000'000));
  }
  // Whether the current request's deadline is less than kLandingMarginNs away: no byte of
  // it may begin to land any more.
  static bool past_landing_deadline(const Conn& c, int64_t now = monotonic_ns()) {
    return c.current.deadline_ns != 0 && now + kLandingMarginNs > c.current.deadline_ns;
  }
  // The current write is past its landing deadline: no byte of it may land any more; the rest
  // of its payload is drained and it is acknowledged with Timeout.
  static void expire(Conn& c) {
    c.target.release();
    release_all(c.pins);
    c.lander = nullptr;
    c.verdict = past_landing_deadline_status();
    c.in = InState::kDrain;
  }

  // Whether the current frame's payload lands in host memory of this process.
  static bool lands_in_host_memory(const Conn& c) {
    return (c.in == InState::kPayload && c.lander == nullptr) || c.in == InState::kVecPayload;
  }

  // The current write's target is not mapped writable in this process (the application
  // unmapped registered memory without unregistering it): nothing more of the request lands,
  // the rest of its payload is drained, and it is refused with NotRegistered. The connection
  // goes on serving.
  static void refuse_unmapped_target(Conn& c, const Status& fault);

  // Appends to `out` (holding `count` iovecs) the current vector frame's targets from where
  // its payload stands, up to `most` bytes and kMaxReceiveEntries iovecs; returns the bytes.
  static uint64_t gather_vec_targets(const Conn& c, uint64_t most, iovec* out, size_t& count) {
    uint64_t bytes = 0;
    uint64_t offset = c.vec_offset;
    for (size_t i = c.vec_index; i < c.entries.size() && count < kMaxReceiveEntries && bytes < most;
         ++i) {
      const uint64_t n = std::min(c.entries[i].length - offset, most - bytes);
      out[count++] = {c.targets[i] + offset, n};
      bytes += n;
      offset = 0;
    }
    return bytes;
  }

  // Copies up to `buffered` input bytes to the current host payload's targets (a vector
  // frame's next entries too) in one system call; returns how many bytes it consumed. A
  // target that faults refuses the request (refuse_unmapped_target): the bytes count as
  // drained.
  size_t land_buffered(Conn& c, size_t buffered) const;

  // This thread's lander for `device`, created on first need.
  Result<TcpDeviceLander*> lander_for(int device);

  // Copies what the current kWrite staged to its device target and waits for the copy. A
  // failed copy, or a deadline that passed while the bytes were staged, ends the request:
  // the rest of it is drained and it is acknowledged with that error (never OK).
  static void land_staged(Conn& c);

  // Reads whatever is available and acts on complete frames. False: close the connection.
  bool on_readable(Conn& c);

  // Accounts for n received bytes in the current state; false: close.
  bool advance(Conn& c, size_t n);

  bool on_header(Conn& c);

  // Replies queued or being staged (device READs) on the connection.
  static size_t queued_replies(const Conn& c) { return c.out.size() + c.staging_reads; }

  // Hands the current kRead of device memory to the read stager; its answer is queued when
  // the stager is done (take_staged_reads). The pin travels with the request.
  Status stage_device_read(Conn& c, Pin pin);

  // Queues the answers of device READs whose staging finished: the kReadData frame is sent
  // from the staging buffers (each lease returns once its bytes are sent), or an error status
  // with no payload. Results for connections closed meanwhile are dropped.
  void take_staged_reads();

  // A vector frame's table is in: every entry is checked against registered memory before
  // any byte lands. A kWriteV with a bad entry is refused whole (its payload drained, the Ack
  // naming the entry); a kReadV is answered with all its entries' bytes in one kReadData.
  bool on_table(Conn& c);

  // Sends queued output, many pieces per sendmsg(), until the socket would block. False: close.
  static bool flush(Conn& c);

  const TcpServerOptions& options_;
  // This process, where the thread lands bytes (copy_to_own_memory): read once, since the
  // thread never changes process (a fork copies only the thread that forks).
  const pid_t pid_ = ::getpid();
  RegionSource regions_;
  std::shared_ptr<TcpDeviceReadService> reads_;  // answers READs of device memory
  Fd epoll_;
  Fd wake_;
  // Where the read stager puts this thread's answers (wakes it through wake_).
  std::shared_ptr<StagedReadInbox> inbox_ = std::make_shared<StagedReadInbox>([this] { signal(); });
  struct Incoming {
    Fd fd;
    ConnectionSlot slot;
  };

  std::atomic<bool> stopping_{false};
  int64_t next_limit_check_ns_ = 0;  // I/O thread only
  LogThrottle frame_overdue_log_;
  // Whether to poll without sleeping (a spell, while polling pays), and the frames and their
  // bytes that began in this round of input (see kTcpHotTime). I/O thread only.
  SpinGate spin_;
  size_t requests_ = 0;
  uint64_t request_bytes_ = 0;
  int request_fd_ = -1;  // the connection of the round's last request
  // The connection a spell polls directly, and the polls of spells so far (every
  // kEpollEvery-th asks epoll instead).
  int spell_fd_ = -1;
  uint32_t spell_polls_ = 0;
  static constexpr uint32_t kEpollEvery = 8;
  std::atomic<bool> signalled_{false};  // the wake-up eventfd was written since last read
  std::mutex mu_;
  std::vector<Incoming> incoming_;                        // guarded by mu_
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // I/O thread only
  // Device memory staging, by device (I/O thread only).
  std::unordered_map<int, std::unique_ptr<TcpDeviceLander>> landers_;
  uint32_t next_serial_ = 0;  // I/O thread only (wraps)
  std::thread thread_;
};

}  // namespace kvferry
