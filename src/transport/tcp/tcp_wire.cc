#include "transport/tcp/tcp_wire.h"

#include <cstring>
#include <string>

namespace kvferry {
namespace {

template <typename T>
void put(std::byte*& out, T value) {
  std::memcpy(out, &value, sizeof(T));
  out += sizeof(T);
}

template <typename T>
T take(const std::byte*& in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  in += sizeof(T);
  return value;
}

}  // namespace

bool tcp_frame_has_payload(TcpFrame type) {
  return type == TcpFrame::kWrite || type == TcpFrame::kReadData || type == TcpFrame::kAuth ||
         type == TcpFrame::kHelloAck;
}

void encode_tcp_header(const TcpHeader& h, std::byte* out) {
  put<uint32_t>(out, kTcpMagic);
  put<uint16_t>(out, kTcpVersion);
  put<uint16_t>(out, static_cast<uint16_t>(h.type));
  put<uint64_t>(out, h.request_id);
  put<uint64_t>(out, h.addr);
  put<uint64_t>(out, h.length);
  put<int64_t>(out, h.deadline_ns);
  put<uint32_t>(out, h.status);
  put<uint32_t>(out, 0);
}

Result<TcpHeader> decode_tcp_header(const std::byte* in) {
  auto magic = take<uint32_t>(in);
  if (magic != kTcpMagic) {
    return ProtocolError("tcp frame: bad magic " + std::to_string(magic) +
                         " (not a kvferry peer?)");
  }
  auto version = take<uint16_t>(in);
  if (version != kTcpVersion) {
    return ProtocolError("tcp frame: unsupported version " + std::to_string(version));
  }
  auto type = take<uint16_t>(in);
  if (type < static_cast<uint16_t>(TcpFrame::kHello) ||
      type > static_cast<uint16_t>(TcpFrame::kReadData)) {
    return ProtocolError("tcp frame: unknown type " + std::to_string(type));
  }
  TcpHeader h;
  h.type = static_cast<TcpFrame>(type);
  h.request_id = take<uint64_t>(in);
  h.addr = take<uint64_t>(in);
  h.length = take<uint64_t>(in);
  h.deadline_ns = take<int64_t>(in);
  h.status = take<uint32_t>(in);
  if ((tcp_frame_has_payload(h.type) || h.type == TcpFrame::kRead) &&
      h.length > kTcpMaxFrameBytes) {
    return ProtocolError("tcp frame: length " + std::to_string(h.length) +
                         " exceeds the limit of " + std::to_string(kTcpMaxFrameBytes));
  }
  if ((h.type == TcpFrame::kAuth || h.type == TcpFrame::kHelloAck) && h.length > kTcpNonceBytes) {
    return ProtocolError("tcp frame: handshake payload of " + std::to_string(h.length) + " bytes");
  }
  if (h.status > static_cast<uint32_t>(StatusCode::kInternal)) {
    return ProtocolError("tcp frame: unknown status code " + std::to_string(h.status));
  }
  if (h.addr + h.length < h.addr) {
    return ProtocolError("tcp frame: range at " + std::to_string(h.addr) + " wraps around");
  }
  return h;
}

}  // namespace kvferry
