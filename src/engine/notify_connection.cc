#include "engine/notify_connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <cerrno>

namespace kvferry::detail {
namespace {

// Bytes received per recv() at most.
constexpr size_t kReceiveChunkBytes = 4096;
// A buffer that grew past this for one frame is given back once the frame is consumed.
constexpr size_t kRetainedBufferBytes = 8192;

void empty_buffer(std::vector<std::byte>& buffer) {
  buffer.clear();
  if (buffer.capacity() > kRetainedBufferBytes) std::vector<std::byte>().swap(buffer);
}

}  // namespace

std::optional<uint32_t> notify_frame_bound(NotifyPhase phase, NotifyFrame type,
                                           uint32_t max_notification_bytes) {
  switch (phase) {
    case NotifyPhase::kHello:
      if (type == NotifyFrame::kHello) return kMaxNotifyHelloBytes;
      break;
    case NotifyPhase::kProof:
      if (type == NotifyFrame::kProof) return static_cast<uint32_t>(sizeof(AuthProof));
      break;
    case NotifyPhase::kServing:
      if (type == NotifyFrame::kNotify) return max_notification_bytes + 8;
      if (type == NotifyFrame::kBye) return 0;
      break;
    case NotifyPhase::kClosing: break;
  }
  return std::nullopt;
}

std::string_view notify_phase_expects(NotifyPhase phase) {
  switch (phase) {
    case NotifyPhase::kHello: return "a hello";
    case NotifyPhase::kProof: return "a proof";
    default: return "a notification or goodbye";
  }
}

ssize_t NotifyConnection::receive_some() {
  const size_t frame_bytes = kFrameHeaderBytes + (header ? header->payload_bytes : size_t{0});
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): received into, then copied
  std::array<std::byte, kReceiveChunkBytes> chunk;
  const size_t want = std::min(frame_bytes - in.size(), chunk.size());
  for (;;) {
    const ssize_t n = ::recv(fd.get(), chunk.data(), want, MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) in.insert(in.end(), chunk.begin(), chunk.begin() + n);
    return n;
  }
}

void NotifyConnection::consume_frame() {
  header.reset();
  empty_buffer(in);
}

void NotifyConnection::queue(NotifyFrame type, std::span<const std::byte> payload) {
  const std::vector<std::byte> frame =
      make_frame(kNotifyFormat, static_cast<uint16_t>(type), payload);
  out.insert(out.end(), frame.begin(), frame.end());
}

bool NotifyConnection::send_some(std::chrono::milliseconds stall_timeout) {
  bool progressed = false;
  while (untaken() > 0) {
    const ssize_t n =
        ::send(fd.get(), out.data() + out_sent, untaken(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return false;
    }
    out_sent += static_cast<size_t>(n);
    progressed = true;
  }
  if (untaken() > 0) {
    if (progressed || out_deadline == kNotifyNever) out_deadline = Clock::now() + stall_timeout;
    return true;
  }
  out_sent = 0;
  empty_buffer(out);
  out_deadline = kNotifyNever;
  if (phase == NotifyPhase::kClosing && !write_shut) {
    // Closing now, with input unread, would send a reset that can destroy the refusal
    // before the sender reads it: half-close, and discard what comes until the sender closes.
    ::shutdown(fd.get(), SHUT_WR);
    write_shut = true;
  }
  return true;
}

bool NotifyConnection::discard_input() {
  for (;;) {
    // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): drained into, never read
    std::array<std::byte, kReceiveChunkBytes> sink;
    const ssize_t n = ::recv(fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

}  // namespace kvferry::detail
