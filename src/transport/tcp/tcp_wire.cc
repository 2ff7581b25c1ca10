#include "transport/tcp/tcp_wire.h"

#include <span>
#include <string>

#include "core/byte_codec.h"

namespace kvferry {

bool tcp_frame_has_payload(TcpFrame type) {
  return type == TcpFrame::kWrite || type == TcpFrame::kReadData || type == TcpFrame::kAuth ||
         type == TcpFrame::kHelloAck || type == TcpFrame::kWriteV;
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
      type > static_cast<uint16_t>(TcpFrame::kReadV)) {
    return ProtocolError("tcp frame: unknown type " + std::to_string(type));
  }
  TcpHeader h;
  h.type = static_cast<TcpFrame>(type);
  r.get(h.request_id);
  r.get(h.addr);
  r.get(h.length);
  r.get(h.deadline_ns);
  r.get(h.status);
  if ((tcp_frame_has_payload(h.type) || h.type == TcpFrame::kRead || h.type == TcpFrame::kReadV) &&
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
  if (tcp_frame_is_vector(h.type)) {
    // addr is the entry count; each entry carries at least one byte.
    if (h.addr == 0 || h.addr > kTcpMaxVecEntries) {
      return ProtocolError("tcp frame: vector entry count " + std::to_string(h.addr) +
                           " outside 1.." + std::to_string(kTcpMaxVecEntries));
    }
    if (h.length < h.addr) {
      return ProtocolError("tcp frame: vector of " + std::to_string(h.addr) + " entries carries " +
                           std::to_string(h.length) + " bytes (each entry needs at least one)");
    }
    return h;
  }
  if (h.addr + h.length < h.addr) {
    return ProtocolError("tcp frame: range at " + std::to_string(h.addr) + " wraps around");
  }
  return h;
}

void encode_tcp_table(std::span<const TcpVecEntry> entries, std::byte* out) {
  for (const TcpVecEntry& e : entries) {
    store_le(out, e.addr);
    store_le(out + 8, e.length);
    out += kTcpVecEntryBytes;
  }
}

Status decode_tcp_table(const TcpHeader& header, const std::byte* in, std::span<TcpVecEntry> out) {
  const uint64_t count = header.addr;
  if (!tcp_frame_is_vector(header.type) || count == 0 || count > out.size()) {
    return ProtocolError("tcp frame: no room for a table of " + std::to_string(count) + " entries");
  }
  uint64_t total = 0;
  for (uint64_t i = 0; i < count; ++i) {
    TcpVecEntry& e = out[i];
    e.addr = load_le<uint64_t>(in + i * kTcpVecEntryBytes);
    e.length = load_le<uint64_t>(in + i * kTcpVecEntryBytes + 8);
    if (e.length == 0 || e.length > header.length - total) {
      return ProtocolError("tcp frame: vector entry " + std::to_string(i) + " has length " +
                           std::to_string(e.length) + " (the frame's " +
                           std::to_string(header.length) + " bytes hold " +
                           std::to_string(header.length - total) + " more)");
    }
    if (e.addr + e.length < e.addr) {
      return ProtocolError("tcp frame: vector entry " + std::to_string(i) + " at " +
                           std::to_string(e.addr) + " wraps around");
    }
    total += e.length;
  }
  if (total != header.length) {
    return ProtocolError("tcp frame: vector entries add up to " + std::to_string(total) +
                         " bytes, the header says " + std::to_string(header.length));
  }
  return Status::Ok();
}

}  // namespace kvferry
