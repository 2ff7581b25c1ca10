#include "core/frame_header.h"

#include <cstring>
#include <string>

#include "core/byte_codec.h"

namespace kvferry {

void encode_frame_header(const FrameHeader& h, std::span<std::byte, kFrameHeaderBytes> out) {
  FixedByteWriter w(out);
  w.put(h.magic);
  w.put(h.version);
  w.put(h.type);
  w.put(h.payload_bytes);
}

FrameHeader make_frame_header(const FrameFormat& format, uint16_t type, uint32_t payload_bytes) {
  return {format.magic, format.version, type, payload_bytes};
}

Result<FrameHeader> decode_frame_header(const FrameFormat& format,
                                        std::span<const std::byte> header,
                                        uint32_t max_payload_bytes) {
  const std::string name(format.name);
  if (header.size() < kFrameHeaderBytes) {
    return ProtocolError(name + " frame header of " + std::to_string(header.size()) +
                         " bytes (need " + std::to_string(kFrameHeaderBytes) + ")");
  }
  ByteReader r(header.first(kFrameHeaderBytes));
  FrameHeader h;
  r.get(h.magic);
  r.get(h.version);
  r.get(h.type);
  r.get(h.payload_bytes);
  if (h.magic != format.magic) {
    return ProtocolError(name + " frame magic " + std::to_string(h.magic) + " (expected " +
                         std::to_string(format.magic) + "; not a kvferry peer?)");
  }
  if (h.version != format.version) {
    return ProtocolError(name + " protocol version " + std::to_string(h.version) +
                         " (this build speaks " + std::to_string(format.version) + ")");
  }
  if (h.type == 0 || h.type > format.max_type) {
    return ProtocolError(name + " message type " + std::to_string(h.type) + " (known: 1.." +
                         std::to_string(format.max_type) + ")");
  }
  if (h.payload_bytes > max_payload_bytes) {
    return ProtocolError(name + " payload of " + std::to_string(h.payload_bytes) +
                         " bytes exceeds the limit of " + std::to_string(max_payload_bytes));
  }
  return h;
}

std::vector<std::byte> make_frame(const FrameFormat& format, uint16_t type,
                                  std::span<const std::byte> payload) {
  std::vector<std::byte> out(kFrameHeaderBytes + payload.size());
  encode_frame_header(make_frame_header(format, type, static_cast<uint32_t>(payload.size())),
                      std::span<std::byte, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
  if (!payload.empty()) std::memcpy(out.data() + kFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

}  // namespace kvferry
