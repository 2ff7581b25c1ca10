#include "transport/tcp/tcp_server.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>

#include "core/auth.h"
#include "core/byte_codec.h"
#include "core/log_throttle.h"
#include "core/logging.h"
#include "core/named_thread.h"
#include "core/own_memory.h"
#include "transport/tcp/tcp_device_lander.h"
#include "transport/tcp/tcp_device_reader.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry {
namespace {

// How long a refused connection is kept half-closed, discarding input, before it is closed.
constexpr int64_t kRefusedDrainNs = 1'000'000'000;
// Input is received into a per-connection buffer of this size, so one recv() brings in many
// small frames (headers, acks, small payloads) at once; payload bytes found there are copied
// to their target (through the kernel, one system call per copy, so registered memory the
// application unmapped is an error, not a crash: core/own_memory.h). A payload with at least
// kDirectReceiveBytes still to come is received straight into its target instead, together
// with whatever follows it into the buffer.
constexpr size_t kInputBufferBytes = size_t{64} << 10;
constexpr uint64_t kDirectReceiveBytes = uint64_t{16} << 10;
// Output pieces gathered into one sendmsg(); acknowledgements are flushed once at least this
// many are queued while input keeps coming, and always when input runs dry (a lone request
// is never kept waiting for company).
constexpr size_t kMaxOutPieces = 256;
constexpr size_t kAckFlushPieces = 32;
// A vector frame's payload is received straight into at most this many entries per recvmsg.
constexpr size_t kMaxReceiveEntries = 64;
// How often an I/O thread looks for connections past a deadline, an idle or a stall limit.
constexpr int64_t kLimitCheckNs = 20'000'000;

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

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

// Finds and pins [addr, +length) in one registered region; device memory only when
// `device_ok` (staged: WRITEs through a lander, READs through the read stager).
Result<Pin> pin_range(const std::shared_ptr<const RegionIndex>& regions, uint64_t addr,
                      uint64_t length, bool device_ok) {
  size_t hint = 0;
  const RegionEntry* r = regions->find(addr, length, hint);
  if (r == nullptr || r->use == nullptr || r->host_ptr == nullptr) {
    return NotRegistered("range [" + std::to_string(addr) + ", +" + std::to_string(length) +
                         ") is outside every registered region of the receiver");
  }
  const bool device = r->location.kind != MemoryLocation::Kind::kHost;
  if (device && !device_ok) {  // a device pointer: not for send()
    return NotSupported("range at " + std::to_string(addr) +
                        " is device memory and this receiver cannot stage it");
  }
  r->use->in_flight.fetch_add(1);
  if (r->use->removed.load()) {
    r->use->in_flight.fetch_sub(1);
    return NotRegistered("region at " + std::to_string(r->addr) + " is being unregistered");
  }
  return Pin{regions, r->use.get(), r->host_ptr + (addr - r->addr),
             device ? r->location.device : -1};
}

// Pins the regions of a vector frame's entries (host memory only): consecutive entries in
// one region share a pin. `targets` gets each entry's pointer. On error nothing stays pinned
// and `bad` is the address of the first entry refused.
Status pin_entries(const std::shared_ptr<const RegionIndex>& regions,
                   std::span<const TcpVecEntry> entries, std::vector<char*>& targets,
                   std::vector<Pin>& pins, uint64_t& bad) {
  targets.clear();
  size_t hint = 0;
  const RegionEntry* last = nullptr;
  auto refuse = [&](const TcpVecEntry& e, Status why) {
    for (Pin& p : pins) p.release();
    pins.clear();
    targets.clear();
    bad = e.addr;
    return why;
  };
  for (const TcpVecEntry& e : entries) {
    const RegionEntry* r = regions->find(e.addr, e.length, hint);
    if (r == nullptr || r->use == nullptr || r->host_ptr == nullptr) {
      return refuse(
          e, NotRegistered("range [" + std::to_string(e.addr) + ", +" + std::to_string(e.length) +
                           ") is outside every registered region of the receiver"));
    }
    if (r->location.kind != MemoryLocation::Kind::kHost) {
      return refuse(e, NotSupported("range at " + std::to_string(e.addr) +
                                    " is device memory; tcp vector frames carry host memory"));
    }
    if (r != last) {
      r->use->in_flight.fetch_add(1);
      if (r->use->removed.load()) {
        r->use->in_flight.fetch_sub(1);
        return refuse(
            e, NotRegistered("region at " + std::to_string(r->addr) + " is being unregistered"));
      }
      pins.push_back(Pin{regions, r->use.get(), r->host_ptr, -1});
      last = r;
    }
    targets.push_back(r->host_ptr + (e.addr - r->addr));
  }
  return Status::Ok();
}

void release_all(std::vector<Pin>& pins) {
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

// Keeps a device READ's source pinned while the read stager copies it.
struct PinHold {
  Pin pin;
  explicit PinHold(Pin p) : pin(std::move(p)) {}
  ~PinHold() { pin.release(); }
  PinHold(const PinHold&) = delete;
  PinHold& operator=(const PinHold&) = delete;
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
  InState in = InState::kHeader;
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
  // Received but not yet consumed: [in_pos, in_end) of input.
  std::unique_ptr<std::byte[]> input = std::make_unique<std::byte[]>(kInputBufferBytes);
  size_t in_pos = 0;
  size_t in_end = 0;

  ~Conn() {
    alive->mark_disconnected("its connection closed");
    target.release();
    release_all(pins);
    for (OutPiece& p : out) p.release();
  }
};

}  // namespace

struct TcpServer::IoThread {
  IoThread(const TcpServerOptions& options, RegionSource regions,
           std::shared_ptr<TcpDeviceReadService> reads)
      : options_(options),
        regions_(std::move(regions)),
        reads_(std::move(reads)),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_.get();
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
    thread_ = named_thread("kvf-tcp-srv", [this] { loop(); });
  }
  ~IoThread() {
    stopping_.store(true);
    signal();
    thread_.join();
    inbox_->close();  // the shared read stager may outlive this thread
  }

  void adopt(Fd fd, ConnectionSlot slot) {
    {
      std::lock_guard lock(mu_);
      incoming_.push_back({std::move(fd), std::move(slot)});
    }
    signal();
  }

 private:
  void signal() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void loop() {
    std::array<epoll_event, 64> events{};
    while (!stopping_.load()) {
      // Wakes at least every 100 ms so a write whose sender went silent mid-payload gives
      // up its pin at its deadline instead of holding the region forever.
      const bool hot = hot_until_ns_ != 0 && monotonic_ns() < hot_until_ns_;
      int n = ::epoll_wait(epoll_.get(), events.data(), events.size(), hot ? 0 : 100);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;
      const int64_t now = monotonic_ns();
      if (now >= next_limit_check_ns_) {
        next_limit_check_ns_ = now + kLimitCheckNs;
        enforce_limits(now);
      }
      requests_ = 0;
      request_bytes_ = 0;
      for (int i = 0; i < n; ++i) {
        int fd = events[i].data.fd;
        if (fd == wake_.get()) {
          uint64_t drained;
          [[maybe_unused]] ssize_t r = ::read(wake_.get(), &drained, sizeof(drained));
          take_incoming();
          take_staged_reads();
          continue;
        }
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        Conn& c = *it->second;
        bool alive = true;
        if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) alive = on_readable(c);
        if (alive && (events[i].events & EPOLLOUT) != 0) alive = flush(c);
        if (alive && c.reading_paused && queued_replies(c) < options_.max_queued_replies) {
          c.reading_paused = false;  // the peer took replies: act on what is buffered
          alive = on_readable(c);
        }
        if (alive) alive = update_interest(c);
        if (!alive) drop(fd);
      }
      if (requests_ == 1 && request_bytes_ <= kTcpHotRequestBytes) {  // see kTcpHotTime
        hot_until_ns_ = monotonic_ns() +
                        std::chrono::duration_cast<std::chrono::nanoseconds>(kTcpHotTime).count();
      } else if (requests_ != 0) {
        hot_until_ns_ = 0;
      }
    }
  }

  // Releases pins past their deadline, and closes connections that are past the hello
  // timeout, idle, or stalled (see tcp_server.h).
  void enforce_limits(int64_t now) {
    const int64_t hello_ns = nanoseconds(options_.limits.hello_timeout);
    const int64_t idle_ns = nanoseconds(options_.limits.idle_timeout);
    const int64_t stall_ns = nanoseconds(options_.stall_timeout);
    const int64_t frame_ns = nanoseconds(options_.frame_rest_timeout);
    std::vector<std::pair<int, const char*>> closing;
    for (auto& [fd, conn] : conns_) {
      Conn& c = *conn;
      if (c.drain_until_ns != 0) {
        if (now > c.drain_until_ns) closing.emplace_back(fd, nullptr);
        continue;
      }
      if ((c.in == InState::kPayload || c.in == InState::kVecPayload) &&
          c.current.deadline_ns != 0 && now > c.current.deadline_ns) {
        expire(c);
      }
      const bool established = c.hello_done && (!options_.secret || c.authenticated);
      const bool in_frame = c.in != InState::kHeader || c.header_have != 0;
      const bool mid_frame = in_frame || c.in_pos < c.in_end;
      if (!established && now - c.accepted_ns > hello_ns) {
        closing.emplace_back(fd, "hello not finished in time");
      } else if (in_frame && !c.reading_paused && now - c.frame_began_ns > frame_ns) {
        log_frame_overdue(c, now);
        closing.emplace_back(fd, nullptr);
      } else if (mid_frame && !c.reading_paused && now - c.last_in_ns > stall_ns) {
        closing.emplace_back(fd, "request payload stalled");
      } else if (!c.out.empty() && now - c.out_since_ns > stall_ns) {
        closing.emplace_back(fd, "replies not read");
      } else if (idle_ns != 0 && !mid_frame && c.out.empty() && c.staging_reads == 0 &&
                 now - c.last_in_ns > idle_ns) {
        closing.emplace_back(fd, nullptr);  // idle: its initiator reopens a lane on next use
      }
    }
    // One line per reason and pass: a flood must not flood the log too.
    std::unordered_map<const char*, size_t> counts;
    for (auto [fd, why] : closing) {
      if (why != nullptr) ++counts[why];
      drop(fd);
    }
    for (auto [why, count] : counts) log().warn("tcp: closed {} connection(s): {}", count, why);
  }

  // One line per interval for connections closed because a frame took longer than
  // frame_rest_timeout as a whole (a trickle of bytes, or a peer that stopped mid-frame).
  void log_frame_overdue(const Conn& c, int64_t now) {
    const int64_t elapsed_ms = (now - c.frame_began_ns) / 1'000'000;
    if (c.in == InState::kHeader) {
      frame_overdue_log_.warn(
          "tcp: closed a connection: a frame header was not complete {} ms after its first byte "
          "({} of {} bytes in after {} ms)",
          options_.frame_rest_timeout.count(), c.header_have, kTcpHeaderBytes, elapsed_ms);
      return;
    }
    const uint64_t received = c.in == InState::kTable  ? c.table_have
                              : c.in == InState::kAuth ? c.proof_have
                                                       : c.current.length - c.remaining;
    frame_overdue_log_.warn(
        "tcp: closed a connection: a frame (type {}, {} bytes at {:#x}) was not complete {} ms "
        "after its first byte ({} bytes of it in after {} ms); nothing of it is acknowledged "
        "and the memory it pinned is released",
        static_cast<int>(c.current.type), c.current.length, c.current.addr,
        options_.frame_rest_timeout.count(), received, elapsed_ms);
  }

  static int64_t nanoseconds(std::chrono::milliseconds d) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  }

  void take_incoming() {
    std::vector<Incoming> fresh;
    {
      std::lock_guard lock(mu_);
      fresh.swap(incoming_);
    }
    const int64_t now = monotonic_ns();
    for (Incoming& in : fresh) {
      Fd& fd = in.fd;
      int raw = fd.get();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = raw;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;
      auto conn = std::make_unique<Conn>();
      conn->fd = std::move(fd);
      conn->slot = std::move(in.slot);
      conn->accepted_ns = conn->last_in_ns = now;
      conn->serial = ++next_serial_;
      conns_.emplace(raw, std::move(conn));
    }
  }

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
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) == 0;
  }

  // Discards input on a refused, half-closed connection. False: it is done (close it).
  static bool discard_input(Conn& c) {
    // Drained into, never read: not zeroed.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
    std::array<std::byte, 4096> sink;
    for (;;) {
      ssize_t n = ::recv(c.fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }

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

  // The current write passed its deadline: no byte of it may land any more; the rest of its
  // payload is drained and it is acknowledged with Timeout.
  static void expire(Conn& c) {
    c.target.release();
    release_all(c.pins);
    c.lander = nullptr;
    c.verdict = Timeout("write request passed its deadline on the receiver");
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
  static void refuse_unmapped_target(Conn& c, const Status& fault) {
    const uint64_t addr =
        c.in == InState::kVecPayload ? c.entries[c.vec_index].addr : c.current.addr;
    log().warn("tcp: refused a write of {} bytes at {:#x}: registered memory {}", c.current.length,
               addr, fault.message());
    if (c.in == InState::kVecPayload) c.refused_addr = addr;
    c.target.release();
    release_all(c.pins);
    c.lander = nullptr;
    c.verdict = NotRegistered(fmt::format(
        "registered memory at {:#x} is not mapped in the receiver (unmapped while registered)",
        addr));
    c.in = InState::kDrain;
  }

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
  static size_t land_buffered(Conn& c, size_t buffered) {
    // Filled up to the count passed: not zeroed per copy.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
    std::array<iovec, kMaxReceiveEntries> targets;
    size_t count = 0;
    size_t bytes = 0;
    if (c.in == InState::kPayload) {
      bytes = std::min<uint64_t>({buffered, c.remaining, kTcpReceivePieceBytes});
      targets[count++] = {c.target.ptr + (c.current.length - c.remaining), bytes};
    } else {
      bytes =
          gather_vec_targets(c, std::min<uint64_t>(buffered, c.remaining), targets.data(), count);
    }
    Status landed = copy_to_own_memory({targets.data(), count}, c.input.get() + c.in_pos, bytes);
    if (!landed.ok()) refuse_unmapped_target(c, landed);
    return bytes;
  }

  // This thread's lander for `device`, created on first need.
  Result<TcpDeviceLander*> lander_for(int device) {
    if (auto it = landers_.find(device); it != landers_.end()) return it->second.get();
    if (!options_.device || !options_.device->built()) {
      return NotSupported("this receiver's build has no CUDA: tcp cannot write device memory");
    }
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, options_.device->api());
    KVF_ASSIGN_OR_RETURN(
        std::unique_ptr<TcpDeviceLander> lander,
        TcpDeviceLander::create(std::move(api), options_.device->buffer_bytes(), device));
    return landers_.emplace(device, std::move(lander)).first->second.get();
  }

  // Copies what the current kWrite staged to its device target and waits for the copy. A
  // failed copy, or a deadline that passed while the bytes were staged, ends the request:
  // the rest of it is drained and it is acknowledged with that error (never OK).
  static void land_staged(Conn& c) {
    if (c.lander == nullptr || c.staged == 0) return;
    const uint64_t bytes = std::exchange(c.staged, 0);
    Status s;
    if (c.current.deadline_ns != 0 && monotonic_ns() > c.current.deadline_ns) {
      s = Timeout("write request passed its deadline on the receiver");
    } else {
      s = c.lander->land(c.target.ptr + c.landed, bytes);
    }
    c.landed += bytes;
    if (s.ok()) return;
    if (s.code() != StatusCode::kTimeout) {
      log().warn("tcp: a write of {} bytes into cuda:{} memory failed: {}", c.current.length,
                 c.target.device, s.message());
    }
    c.verdict = s;
    c.target.release();
    c.lander = nullptr;
    c.in = InState::kDrain;
  }

  // Reads whatever is available and acts on complete frames. False: close the connection.
  bool on_readable(Conn& c) {
    // Drained into, never read: not zeroed.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
    std::array<std::byte, kTcpScratchBytes> scratch;
    bool drained = false;
    for (;;) {
      // Once refused, nothing that follows is acted on (not even another kAuth): the
      // refusal is flushed and the connection closed.
      if (c.close_after_flush) return c.drain_until_ns != 0 ? discard_input(c) : flush(c);
      // A peer that does not read its replies is not read either, so what it sends cannot
      // grow the queue without bound (a flood of zero-length Reads).
      if (c.in == InState::kHeader && queued_replies(c) >= options_.max_queued_replies) {
        if (!flush(c)) return false;
        if (queued_replies(c) >= options_.max_queued_replies) {
          c.reading_paused = true;
          return true;
        }
      }
      void* into = nullptr;
      size_t want = 0;
      switch (c.in) {
        case InState::kHeader:
          into = c.header.data() + c.header_have;
          want = kTcpHeaderBytes - c.header_have;
          break;
        case InState::kPayload:
          if (monotonic_ns() > c.current.deadline_ns && c.current.deadline_ns != 0) {
            expire(c);  // past its deadline: no byte of it may land any more
            continue;
          }
          into = c.target.ptr + (c.current.length - c.remaining);
          // At most one piece per recv, so the deadline is checked at least that often.
          want = std::min<uint64_t>(c.remaining, kTcpReceivePieceBytes);
          if (c.lander != nullptr) {  // device memory: into the staging buffer
            into = c.lander->buffer() + c.staged;
            want = std::min(want, c.lander->capacity() - c.staged);
          }
          break;
        case InState::kDrain:
          into = scratch.data();
          want = std::min<uint64_t>(c.remaining, scratch.size());
          break;
        case InState::kAuth:
          into = c.proof.data() + c.proof_have;
          want = c.current.length - c.proof_have;
          break;
        case InState::kTable:
          into = c.table.data() + c.table_have;
          want = c.table.size() - c.table_have;
          break;
        case InState::kVecPayload:
          if (monotonic_ns() > c.current.deadline_ns && c.current.deadline_ns != 0) {
            expire(c);
            continue;
          }
          into = c.targets[c.vec_index] + c.vec_offset;
          want = std::min<uint64_t>(c.entries[c.vec_index].length - c.vec_offset,
                                    kTcpReceivePieceBytes);
          break;
      }
      if (want == 0) {
        if (!advance(c, 0)) return false;
        continue;
      }
      // Bytes already buffered first.
      if (c.in_pos < c.in_end) {
        size_t n = std::min<size_t>(want, c.in_end - c.in_pos);
        if (lands_in_host_memory(c)) {
          n = land_buffered(c, c.in_end - c.in_pos);
        } else if (c.in != InState::kDrain) {
          std::memcpy(into, c.input.get() + c.in_pos, n);  // this connection's own buffers
        }
        c.in_pos += n;
        if (!advance(c, n)) return false;
        if (c.out.size() >= kAckFlushPieces && !flush(c)) return false;
        continue;
      }
      // After a lone small request (see kTcpHotTime), a short receive drained the socket:
      // the reply leaves now, and epoll (level-triggered) reports what comes next, instead
      // of one more recvmsg that would find nothing.
      if (drained) {
        land_staged(c);
        return flush(c);
      }
      c.in_pos = c.in_end = 0;
      // A large payload goes straight into its target, a vector frame's into its next
      // entries' targets; what follows lands in the buffer. Everything else is received into
      // the buffer in one go.
      // Filled up to the count passed: not zeroed per receive.
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
      std::array<iovec, kMaxReceiveEntries + 1> iov;
      size_t iov_count = 0;
      bool direct = false;
      // Bytes received straight into host memory land unseen, so only bytes already queued
      // on the socket when the deadline was last checked may go there: the initiator pads a
      // frame whose deadline passed mid-send with zeros sent after its deadline (never
      // earlier than ours), and those must be drained, never landed. Buffered bytes are
      // safe as they are: the deadline is checked after they arrived, before they are copied.
      const bool host_target = lands_in_host_memory(c);
      uint64_t landable = std::numeric_limits<uint64_t>::max();
      if (host_target && c.current.deadline_ns != 0 &&
          std::min(want, c.remaining) >= kDirectReceiveBytes) {
        int queued = 0;
        landable = ::ioctl(c.fd.get(), FIONREAD, &queued) == 0 ? static_cast<uint64_t>(queued) : 0;
        if (monotonic_ns() > c.current.deadline_ns) {
          expire(c);
          continue;
        }
      }
      if (c.in == InState::kPayload && std::min<uint64_t>(want, landable) >= kDirectReceiveBytes) {
        direct = true;
        want = std::min<uint64_t>(want, landable);
        iov[iov_count++] = {into, want};
      } else if (c.in == InState::kVecPayload &&
                 std::min(c.remaining, landable) >= kDirectReceiveBytes) {
        // Up to one piece's worth, so the deadline is checked as often as for a kWrite.
        direct = true;
        want =
            gather_vec_targets(c, std::min(landable, kTcpReceivePieceBytes), iov.data(), iov_count);
      }
      iov[iov_count++] = {c.input.get(), kInputBufferBytes};
      msghdr msg{};
      msg.msg_iov = iov.data();
      msg.msg_iovlen = iov_count;
      ssize_t n = ::recvmsg(c.fd.get(), &msg, MSG_DONTWAIT);
      if (n == 0) return false;  // peer closed
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          // The staging buffer is the I/O thread's: empty it before serving another.
          land_staged(c);
          return flush(c);
        }
        if (errno == EINTR) continue;
        if (errno == EFAULT && direct) {  // nothing was received: the payload is drained
          refuse_unmapped_target(c, InvalidArgument("is not mapped writable in this process"));
          continue;
        }
        return false;
      }
      c.last_in_ns = monotonic_ns();
      auto received = static_cast<size_t>(n);
      drained = hot_until_ns_ != 0 && received < (direct ? want : 0) + kInputBufferBytes;
      if (direct) {
        const size_t into_target = std::min(received, want);
        c.in_end = received - into_target;
        if (!advance(c, into_target)) return false;
      } else {
        c.in_end = received;
      }
    }
  }

  // Accounts for n received bytes in the current state; false: close.
  bool advance(Conn& c, size_t n) {
    switch (c.in) {
      case InState::kHeader:
        if (c.header_have == 0 && n != 0) c.frame_began_ns = monotonic_ns();
        c.header_have += n;
        if (c.header_have < kTcpHeaderBytes) return true;
        c.header_have = 0;
        return on_header(c);
      case InState::kPayload:
      case InState::kDrain:
        c.remaining -= n;
        if (c.in == InState::kPayload && c.lander != nullptr) {
          c.staged += n;
          if (c.staged == c.lander->capacity() || c.remaining == 0) land_staged(c);
        }
        if (c.remaining != 0) return true;
        c.target.release();
        release_all(c.pins);
        c.lander = nullptr;
        ack(c, c.current.request_id, c.verdict, c.refused_addr);
        c.in = InState::kHeader;
        return true;
      case InState::kVecPayload:
        c.remaining -= n;
        while (n != 0) {
          const uint64_t take = std::min<uint64_t>(n, c.entries[c.vec_index].length - c.vec_offset);
          c.vec_offset += take;
          n -= take;
          if (c.vec_offset == c.entries[c.vec_index].length) {
            ++c.vec_index;
            c.vec_offset = 0;
          }
        }
        if (c.remaining != 0) return true;
        release_all(c.pins);
        ack(c, c.current.request_id, c.verdict);
        c.in = InState::kHeader;
        return true;
      case InState::kTable:
        c.table_have += n;
        if (c.table_have < c.table.size()) return true;
        return on_table(c);
      case InState::kAuth:
        c.proof_have += n;
        if (c.proof_have < c.current.length) return true;
        c.in = InState::kHeader;
        if (auth_proof_matches(auth_proof(*options_.secret, c.nonce), c.proof)) {
          c.authenticated = true;
          ack(c, c.current.request_id, Status::Ok());
          return true;
        }
        log().warn("tcp: refused a connection that failed authentication");
        ack(c, c.current.request_id, Unauthenticated("wrong secret"));
        c.close_after_flush = true;
        return true;
    }
    return false;
  }

  bool on_header(Conn& c) {
    if (!c.hello_done && load_le<uint32_t>(c.header.data()) == kTcpMagic &&
        load_le<uint16_t>(c.header.data() + 4) != kTcpVersion) {
      // A kvferry peer of another protocol version: told so (in our version, which it refuses
      // loudly), then closed.
      const auto version = load_le<uint16_t>(c.header.data() + 4);
      log().warn("tcp: refused a peer speaking protocol version {} (this receiver speaks {})",
                 version, kTcpVersion);
      ack(c, 0, ProtocolError("tcp protocol version"));
      c.close_after_flush = true;
      return true;
    }
    auto decoded = decode_tcp_header(c.header.data());
    if (!decoded.ok()) {
      log().warn("tcp: closing a connection: {}", decoded.status().message());
      return false;
    }
    c.current = *decoded;
    c.refused_addr = 0;
    ++requests_;
    request_bytes_ += c.current.length;
    const bool auth_required = options_.secret.has_value() && !c.authenticated;
    if (!c.hello_done) {
      // A kHello carries nothing but its header (its length would be read as frames).
      if (c.current.type != TcpFrame::kHello || c.current.length != 0) return false;
      c.hello_done = true;
      TcpHeader reply;
      reply.type = TcpFrame::kHelloAck;
      reply.request_id = options_.incarnation;
      reply.deadline_ns = monotonic_ns();
      OutPiece piece;
      if (options_.secret) {
        auto nonce = make_auth_nonce();
        if (!nonce.ok()) return false;
        c.nonce = *nonce;
        piece.owned.assign(c.nonce.begin(), c.nonce.end());
        reply.length = piece.owned.size();
      }
      queue(c, reply, std::move(piece));
      return true;
    }
    if (auth_required) {
      if (c.current.type != TcpFrame::kAuth || c.current.length != kTcpProofBytes) {
        log().warn("tcp: refused an unauthenticated request");
        ack(c, c.current.request_id, Unauthenticated("authentication required"));
        c.close_after_flush = true;
        return true;
      }
      c.proof_have = 0;
      c.in = InState::kAuth;
      return true;
    }
    switch (c.current.type) {
      case TcpFrame::kWrite: {
        c.remaining = c.current.length;
        auto pin = pin_range(regions_(), c.current.addr, c.current.length, true);
        if (pin.ok() && pin->device >= 0) {
          Result<TcpDeviceLander*> lander = lander_for(pin->device);
          if (!lander.ok()) {
            pin->release();
            pin = lander.status();
          }
          c.lander = lander.ok() ? *lander : nullptr;
          c.staged = 0;
          c.landed = 0;
        }
        if (pin.ok()) {
          c.target = std::move(*pin);
          c.verdict = Status::Ok();
          c.in = InState::kPayload;
        } else {
          c.verdict = pin.status();
          c.in = InState::kDrain;
        }
        if (c.remaining == 0) return advance(c, 0);
        return true;
      }
      case TcpFrame::kRead: {
        TcpHeader reply;
        reply.type = TcpFrame::kReadData;
        reply.request_id = c.current.request_id;
        auto pin = pin_range(regions_(), c.current.addr, c.current.length, true);
        if (pin.ok() && pin->device >= 0) {  // answered once staged (take_staged_reads)
          Status staging = stage_device_read(c, std::move(*pin));
          if (staging.ok()) return true;
          pin = staging;
        }
        OutPiece piece;
        if (pin.ok()) {
          reply.length = c.current.length;
          piece.payload = pin->ptr;
          piece.payload_len = c.current.length;
          piece.pin = std::move(*pin);
        } else {
          reply.status = static_cast<uint32_t>(pin.status().code());
        }
        queue(c, reply, std::move(piece));
        return true;
      }
      case TcpFrame::kWriteV:
      case TcpFrame::kReadV:
        c.table.resize(tcp_table_bytes(c.current));
        c.table_have = 0;
        c.in = InState::kTable;
        return true;
      default:
        log().warn("tcp: unexpected frame type {} from an initiator",
                   static_cast<int>(c.current.type));
        return false;
    }
  }

  // Replies queued or being staged (device READs) on the connection.
  static size_t queued_replies(const Conn& c) { return c.out.size() + c.staging_reads; }

  // Hands the current kRead of device memory to the read stager; its answer is queued when
  // the stager is done (take_staged_reads). The pin travels with the request.
  Status stage_device_read(Conn& c, Pin pin) {
    Result<TcpDeviceReadStager*> stager = reads_->stager();
    if (!stager.ok()) {
      pin.release();
      return stager.status();
    }
    const auto deadline = c.current.deadline_ns != 0
                              ? Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::nanoseconds(c.current.deadline_ns)))
                              : Clock::now() + std::chrono::hours(1);
    const char* src = pin.ptr;
    const int device = pin.device;
    ++c.staging_reads;
    (*stager)->stage(inbox_, (uint64_t{c.serial} << 32) | static_cast<uint32_t>(c.fd.get()),
                     c.current.request_id, src, c.current.length, device, deadline, c.alive,
                     std::make_shared<PinHold>(std::move(pin)));
    return Status::Ok();
  }

  // Queues the answers of device READs whose staging finished: the kReadData frame is sent
  // from the staging buffers (each lease returns once its bytes are sent), or an error status
  // with no payload. Results for connections closed meanwhile are dropped.
  void take_staged_reads() {
    std::vector<int> touched;
    for (StagedRead& r : inbox_->take()) {
      const int fd = static_cast<int>(r.conn & 0xffffffffu);
      auto it = conns_.find(fd);
      if (it == conns_.end() || it->second->serial != (r.conn >> 32)) continue;
      Conn& c = *it->second;
      --c.staging_reads;
      TcpHeader reply;
      reply.type = TcpFrame::kReadData;
      reply.request_id = r.request_id;
      if (!r.status.ok()) {
        const StatusCode code = r.status.code();
        if (code != StatusCode::kTimeout && code != StatusCode::kPeerDisconnected) {
          log().warn("tcp: a read of {} bytes of device memory failed: {}", r.length,
                     r.status.message());
        }
        reply.status = static_cast<uint32_t>(code);
        queue(c, reply);
      } else {
        reply.length = r.length;
        for (size_t i = 0; i < r.pieces.size(); ++i) {
          OutPiece piece;
          piece.payload = r.pieces[i].data();
          piece.payload_len = std::min(r.pieces[i].bytes(), r.length - i * r.pieces[0].bytes());
          piece.staging = std::move(r.pieces[i]);
          if (i == 0) {
            queue(c, reply, std::move(piece));
          } else {
            piece.header_sent = kTcpHeaderBytes;  // one frame: the header went with piece 0
            c.out.push_back(std::move(piece));
          }
        }
        if (r.pieces.empty()) queue(c, reply);
      }
      touched.push_back(fd);
    }
    for (int fd : touched) {
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      bool alive = flush(c);
      if (alive && c.reading_paused && queued_replies(c) < options_.max_queued_replies) {
        c.reading_paused = false;
        alive = on_readable(c);
      }
      if (alive) alive = update_interest(c);
      if (!alive) drop(fd);
    }
  }

  // A vector frame's table is in: every entry is checked against registered memory before
  // any byte lands. A kWriteV with a bad entry is refused whole (its payload drained, the Ack
  // naming the entry); a kReadV is answered with all its entries' bytes in one kReadData.
  bool on_table(Conn& c) {
    c.entries.resize(c.current.addr);
    if (Status s = decode_tcp_table(c.current, c.table.data(), c.entries); !s.ok()) {
      log().warn("tcp: closing a connection: {}", s.message());
      return false;
    }
    uint64_t bad = 0;
    Status pinned = pin_entries(regions_(), c.entries, c.targets, c.pins, bad);
    if (c.current.type == TcpFrame::kWriteV) {
      c.remaining = c.current.length;
      c.verdict = pinned;
      if (pinned.ok()) {
        c.vec_index = 0;
        c.vec_offset = 0;
        c.in = InState::kVecPayload;
      } else {
        c.refused_addr = bad;
        c.in = InState::kDrain;
      }
      return true;
    }
    c.in = InState::kHeader;
    TcpHeader reply;
    reply.type = TcpFrame::kReadData;
    reply.request_id = c.current.request_id;
    if (!pinned.ok()) {
      reply.addr = bad;
      reply.status = static_cast<uint32_t>(pinned.code());
      queue(c, reply);
      return true;
    }
    reply.length = c.current.length;
    // Entries that follow each other in this process's memory go out as one piece (one iovec).
    for (size_t i = 0; i < c.entries.size();) {
      const bool first = i == 0;
      OutPiece piece;
      piece.payload = c.targets[i];
      piece.payload_len = c.entries[i].length;
      for (++i; i < c.entries.size() && c.targets[i] == piece.payload + piece.payload_len; ++i) {
        piece.payload_len += c.entries[i].length;
      }
      if (i == c.entries.size()) piece.pins = std::move(c.pins);
      if (first) {
        queue(c, reply, std::move(piece));
      } else {
        piece.header_sent = kTcpHeaderBytes;  // one frame: the header went with the first
        c.out.push_back(std::move(piece));
      }
    }
    c.pins.clear();
    return true;
  }

  // Sends queued output, many pieces per sendmsg(), until the socket would block. False: close.
  static bool flush(Conn& c) {
    // Filled before each sendmsg up to the count it passes: not zeroed per flush.
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
    std::array<iovec, 2 * kMaxOutPieces> iov;
    while (!c.out.empty()) {
      size_t count = 0;
      for (size_t i = 0; i < c.out.size() && i < kMaxOutPieces; ++i) {
        OutPiece& p = c.out[i];
        if (p.header_sent < kTcpHeaderBytes) {
          iov[count++] = {p.header.data() + p.header_sent, kTcpHeaderBytes - p.header_sent};
        }
        const std::byte* payload =
            p.owned.empty() ? reinterpret_cast<const std::byte*>(p.payload) : p.owned.data();
        const uint64_t payload_len = p.owned.empty() ? p.payload_len : p.owned.size();
        if (payload != nullptr && p.payload_sent < payload_len) {
          iov[count++] = {const_cast<std::byte*>(payload) + p.payload_sent,
                          payload_len - p.payload_sent};
        }
      }
      ssize_t n = 0;
      if (count != 0) {
        msghdr msg{};
        msg.msg_iov = iov.data();
        msg.msg_iovlen = count;
        n = ::sendmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
          if (errno == EINTR) continue;
          if (errno == EFAULT) {
            // A READ's header may be out already: its payload cannot be replaced by an error.
            log().warn(
                "tcp: closing a connection: the registered memory a read was answered from is "
                "not mapped in this process (unmapped while registered)");
          }
          return false;
        }
      }
      // Retire what was sent, piece by piece.
      auto sent = static_cast<uint64_t>(n);
      if (sent != 0) c.out_since_ns = monotonic_ns();
      while (!c.out.empty()) {
        OutPiece& p = c.out.front();
        const uint64_t header_take = std::min<uint64_t>(sent, kTcpHeaderBytes - p.header_sent);
        p.header_sent += header_take;
        sent -= header_take;
        const uint64_t payload_len = p.owned.empty() ? p.payload_len : p.owned.size();
        const uint64_t payload_take = std::min(sent, payload_len - p.payload_sent);
        p.payload_sent += payload_take;
        sent -= payload_take;
        if (p.header_sent < kTcpHeaderBytes || p.payload_sent < payload_len) break;
        p.release();
        c.out.pop_front();
      }
    }
    return true;
  }

  const TcpServerOptions& options_;
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
  // Polling without sleeping until then (0: not), and the frames and their bytes that began
  // in this round of input (see kTcpHotTime). I/O thread only.
  int64_t hot_until_ns_ = 0;
  size_t requests_ = 0;
  uint64_t request_bytes_ = 0;
  std::mutex mu_;
  std::vector<Incoming> incoming_;                        // guarded by mu_
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // I/O thread only
  // Device memory staging, by device (I/O thread only).
  std::unordered_map<int, std::unique_ptr<TcpDeviceLander>> landers_;
  uint32_t next_serial_ = 0;  // I/O thread only (wraps)
  std::thread thread_;
};

Result<std::unique_ptr<TcpServer>> TcpServer::start(const TcpServerOptions& options,
                                                    RegionSource regions) {
  if (options.io_threads < 1 || options.io_threads > 64) {
    return InvalidArgument("tcp io_threads " + std::to_string(options.io_threads) +
                           " out of range 1..64");
  }
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Acceptor> acceptor,
                       Acceptor::bind(options.listen, Acceptor::Options::named("tcp", SOCK_NONBLOCK,
                                                                               options.limits)));
  auto server =
      std::unique_ptr<TcpServer>(new TcpServer(options, std::move(regions), std::move(acceptor)));
  server->acceptor_->start([s = server.get()](Fd conn, ConnectionSlot slot) {
    int one = 1;
    ::setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    s->io_[s->next_io_.fetch_add(1) % s->io_.size()]->adopt(std::move(conn), std::move(slot));
  });
  return server;
}

TcpServer::TcpServer(const TcpServerOptions& options, RegionSource regions,
                     std::unique_ptr<Acceptor> acceptor)
    : options_(options), regions_(std::move(regions)), acceptor_(std::move(acceptor)) {
  auto reads = std::make_shared<TcpDeviceReadService>(options_.device);
  for (int i = 0; i < options_.io_threads; ++i) {
    io_.push_back(std::make_unique<IoThread>(options_, regions_, reads));
  }
}

TcpServer::~TcpServer() {
  acceptor_->stop();  // before the I/O threads go: the acceptor hands connections to them
  io_.clear();
}

const Endpoint& TcpServer::endpoint() const { return acceptor_->endpoint(); }

}  // namespace kvferry
