#include "transport/tcp/tcp_wire.h"

#include <span>
#include <string>

#include "core/byte_codec.h"

namespace kvferry {

bool tcp_frame_has_payload(TcpFrame type) {
  return type == TcpFrame::kWrite || type == TcpFrame::kReadData || type == TcpFrame::kAuth ||
         type == TcpFrame::kHelloAck;
}

void encode_tcp_header(const TcpHeader& h, std::byte* out) {
  FixedByteWriter w({out, kTcpHeaderBytes});
  w.put(kTcpMagic);
  w.put(kTcpVersion);
  w.put(static_cast<uint16_t>(h.type));
  w.put(h.request_id);
  w.put(h.addr);
  w.put(h.length);
  w.put(h.deadline_ns);
  w.put(h.status);
  w.put(uint32_t{0});  // reserved
}

Result<TcpHeader> decode_tcp_header(const std::byte* in) {
  // A whole header is always there (the caller passes kTcpHeaderBytes), so no get fails.
  ByteReader r({in, kTcpHeaderBytes});
  uint32_t magic = 0;
  r.get(magic);
  if (magic != kTcpMagic) {
    return ProtocolError("tcp frame: bad magic " + std::to_string(magic) +
                         " (not a kvferry peer?)");
  }
  uint16_t version = 0;
  r.get(version);
  if (version != kTcpVersion) {
    return ProtocolError("tcp frame: unsupported version " + std::to_string(version));
  }
  uint16_t type = 0;
  r.get(type);
  if (type < static_cast<uint16_t>(TcpFrame::kHello) ||
      type > static_cast<uint16_t>(TcpFrame::kReadData)) {
    return ProtocolError("tcp frame: unknown type " + std::to_string(type));
  }
  TcpHeader h;
  h.type = static_cast<TcpFrame>(type);
  r.get(h.request_id);
  r.get(h.addr);
  r.get(h.length);
  r.get(h.deadline_ns);
  r.get(h.status);
  if ((tcp_frame_has_payload(h.type) || h.type == TcpFrame::kRead) &&
      h.length > kTcpMaxFrameBytes) {
    return ProtocolError("tcp frame: length " + std::to_string(h.length) +
                         " exceeds the limit of " + std::to_string(kTcpMaxFrameBytes));
  }
  if ((h.type == TcpFrame::kAuth || h.type == TcpFrame::kHelloAck) && h.length > kTcpNonceBytes) {
    return ProtocolError("tcp frame: handshake payload of " + std::to_string(h.length) + " bytes");
  }
  if (!is_valid_status_code(h.status)) {
    return ProtocolError("tcp frame: unknown status code " + std::to_string(h.status));
  }
  if (h.addr + h.length < h.addr) {
    return ProtocolError("tcp frame: range at " + std::to_string(h.addr) + " wraps around");
  }
  return h;
}

}  // namespace kvferry
