#include "engine/notify_wire.h"

#include <fmt/format.h>
#include <poll.h>

#include <cerrno>
#include <cstring>

#include "core/byte_codec.h"

namespace kvferry::detail {
namespace {

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

}  // namespace

std::vector<std::byte> encode_hello(const NotifyHello& hello) {
  ByteWriter w;
  w.put(hello.target_incarnation);
  w.put(hello.sender_incarnation);
  w.put_string(hello.sender_name);
  w.put_string(hello.sender_endpoint);
  return std::move(w).take();
}

Result<NotifyHello> decode_hello(std::span<const std::byte> payload) {
  ByteReader r(payload);
  NotifyHello h;
  if (!r.get(h.target_incarnation) || !r.get(h.sender_incarnation) ||
      !r.get_string(h.sender_name, kMaxNotifySenderNameBytes) ||
      !r.get_string(h.sender_endpoint, kMaxNotifySenderEndpointBytes) || r.remaining() != 0) {
    return ProtocolError(
        fmt::format("notification hello of {} bytes is malformed", payload.size()));
  }
  return h;
}

std::vector<std::byte> encode_challenge(const NotifyChallenge& c) {
  ByteWriter w;
  w.put(c.target_incarnation);
  w.put(c.max_notification_bytes);
  w.put_string(c.nonce);
  return std::move(w).take();
}

Result<NotifyChallenge> decode_challenge(std::span<const std::byte> payload) {
  ByteReader r(payload);
  NotifyChallenge c;
  if (!r.get(c.target_incarnation) || !r.get(c.max_notification_bytes) ||
      !r.get_string(c.nonce, kMaxNotifyControlBytes) || r.remaining() != 0) {
    return ProtocolError(
        fmt::format("notification challenge of {} bytes is malformed", payload.size()));
  }
  return c;
}

std::vector<std::byte> encode_notify(uint64_t sequence, std::string_view bytes) {
  ByteWriter w;
  w.put(sequence);
  w.put_bytes(as_bytes(bytes));
  return std::move(w).take();
}

std::vector<std::byte> encode_sequence(uint64_t sequence) {
  ByteWriter w;
  w.put(sequence);
  return std::move(w).take();
}

Result<uint64_t> decode_sequence(std::span<const std::byte> payload) {
  ByteReader r(payload);
  uint64_t sequence = 0;
  if (!r.get(sequence) || r.remaining() != 0) {
    return ProtocolError(
        fmt::format("notification ack of {} bytes is malformed (expected 8)", payload.size()));
  }
  return sequence;
}

Status write_notify_frame(int fd, NotifyFrame type, std::span<const std::byte> payload,
                          Clock::time_point deadline) {
  std::vector<std::byte> frame(kFrameHeaderBytes + payload.size());
  encode_frame_header(make_frame_header(kNotifyFormat, static_cast<uint16_t>(type),
                                        static_cast<uint32_t>(payload.size())),
                      std::span<std::byte, kFrameHeaderBytes>(frame.data(), kFrameHeaderBytes));
  if (!payload.empty())
    std::memcpy(frame.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return send_all(fd, frame, deadline);
}

Result<NotifyMessage> read_notify_frame(int fd, uint32_t max_payload, Clock::time_point deadline) {
  std::byte header_bytes[kFrameHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(fd, header_bytes, deadline));
  // The largest bound any type may have; the type's own bound is checked below, still
  // before the payload is allocated.
  const uint32_t limit = std::max(max_payload + 8, kMaxNotifyControlBytes);
  KVF_ASSIGN_OR_RETURN(FrameHeader h, decode_frame_header(kNotifyFormat, header_bytes, limit));
  const auto type = static_cast<NotifyFrame>(h.type);
  const uint32_t bound = type == NotifyFrame::kNotify ? max_payload + 8 : kMaxNotifyControlBytes;
  if (h.payload_bytes > bound) {
    return ProtocolError(fmt::format("notification frame of type {} carries {} bytes (limit {})",
                                     h.type, h.payload_bytes, bound));
  }
  NotifyMessage m{type, std::vector<std::byte>(h.payload_bytes)};
  KVF_RETURN_IF_ERROR(recv_all(fd, m.payload, deadline));
  return m;
}

bool wait_readable(int fd, Clock::time_point until) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
  pollfd p{fd, POLLIN, 0};
  const int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
  return rc > 0;
}

}  // namespace kvferry::detail
