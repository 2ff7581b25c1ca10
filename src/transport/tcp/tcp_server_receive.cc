// The tcp receiver's frame receiver: input read from a connection (into its buffer, or
// straight into registered memory), the state machine over frames, and the requests acted
// on: the hello and authentication, WRITEs landed (in device memory through a lander), READs
// answered, vector frames' tables checked and pinned.
#include <fmt/format.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <span>
#include <string>

#include "core/byte_codec.h"
#include "core/logging.h"
#include "core/own_memory.h"
#include "transport/landing_fence.h"
#include "transport/tcp/tcp_server_io.h"

namespace kvferry {
namespace {

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

}  // namespace

void TcpServer::IoThread::refuse_unmapped_target(Conn& c, const Status& fault) {
  const uint64_t addr = c.in == InState::kVecPayload ? c.entries[c.vec_index].addr : c.current.addr;
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

size_t TcpServer::IoThread::land_buffered(Conn& c, size_t buffered) const {
  // Filled up to the count passed: not zeroed per copy.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kMaxReceiveEntries> targets;
  size_t count = 0;
  size_t bytes = 0;
  if (c.in == InState::kPayload) {
    bytes = std::min<uint64_t>({buffered, c.remaining, kTcpReceivePieceBytes});
    targets[count++] = {c.target.ptr + (c.current.length - c.remaining), bytes};
  } else {
    bytes = gather_vec_targets(c, std::min<uint64_t>(buffered, c.remaining), targets.data(), count);
  }
  Status landed =
      copy_to_own_memory(pid_, {targets.data(), count}, c.input.get() + c.in_pos, bytes);
  if (!landed.ok()) refuse_unmapped_target(c, landed);
  return bytes;
}

Result<TcpDeviceLander*> TcpServer::IoThread::lander_for(int device) {
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

void TcpServer::IoThread::land_staged(Conn& c) {
  if (c.lander == nullptr || c.staged == 0) return;
  const uint64_t bytes = std::exchange(c.staged, 0);
  Status s;
  if (past_landing_deadline(c)) {
    s = past_landing_deadline_status();
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

bool TcpServer::IoThread::on_readable(Conn& c) {
  // Drained into, never read: not zeroed.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<std::byte, kTcpScratchBytes> scratch;
  bool drained = false;
  for (;;) {
    // A turn may check a write's deadline and land its bytes: it does both in one window.
    LandingWindow window;
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
        if (past_landing_deadline(c)) {
          expire(c);
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
        if (past_landing_deadline(c)) {
          expire(c);
          continue;
        }
        into = c.targets[c.vec_index] + c.vec_offset;
        want =
            std::min<uint64_t>(c.entries[c.vec_index].length - c.vec_offset, kTcpReceivePieceBytes);
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
    // A short receive drained the socket: the reply leaves now, and epoll (level-triggered)
    // reports what comes next, instead of one more recvmsg that would find nothing.
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
      if (past_landing_deadline(c)) {
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
    // After a large kWrite: what is left of it that is not received straight into its
    // target (a tail, or a refused payload to drain), then the next header only.
    size_t take = kInputBufferBytes;
    if (c.large_writes) {
      const uint64_t rest = direct || c.in == InState::kHeader ? 0 : c.remaining;
      take = std::min<uint64_t>(take, rest + kTcpHeaderBytes - c.header_have);
    }
    iov[iov_count++] = {c.input.get(), take};
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
    drained = received < (direct ? want : 0) + take;
    if (direct) {
      const size_t into_target = std::min(received, want);
      c.in_end = received - into_target;
      if (!advance(c, into_target)) return false;
    } else {
      c.in_end = received;
    }
  }
}

bool TcpServer::IoThread::advance(Conn& c, size_t n) {
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

bool TcpServer::IoThread::on_header(Conn& c) {
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
  c.large_writes = c.current.type == TcpFrame::kWrite && c.current.length >= kDirectReceiveBytes;
  ++requests_;
  request_bytes_ += c.current.length;
  request_fd_ = c.fd.get();
  const bool auth_required = options_.secret.has_value() && !c.authenticated;
  if (!c.hello_done) {
    // A kHello carries nothing but its header (its length would be read as frames).
    if (c.current.type != TcpFrame::kHello || c.current.length != 0) return false;
    c.hello_done = true;
    TcpHeader reply;
    reply.type = TcpFrame::kHelloAck;
    reply.request_id = options_.incarnation;
    reply.addr = static_cast<uint64_t>(options_.limits.idle_timeout.count());
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

bool TcpServer::IoThread::on_table(Conn& c) {
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

}  // namespace kvferry
