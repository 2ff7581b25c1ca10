// The tcp receiver's reply side: queued replies sent many to a sendmsg, and the answers of
// READs of device memory, staged by the read stager and queued when it is done.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>

#include "core/logging.h"
#include "transport/tcp/tcp_server_io.h"

namespace kvferry {
namespace {

// Keeps a device READ's source pinned while the read stager copies it.
struct PinHold {
  Pin pin;
  explicit PinHold(Pin p) : pin(std::move(p)) {}
  ~PinHold() { pin.release(); }
  PinHold(const PinHold&) = delete;
  PinHold& operator=(const PinHold&) = delete;
};

}  // namespace

Status TcpServer::IoThread::stage_device_read(Conn& c, Pin pin) {
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

void TcpServer::IoThread::take_staged_reads() {
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

bool TcpServer::IoThread::flush(Conn& c) {
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

}  // namespace kvferry
