// The 12-byte frame header shared by kvferry's framed TCP protocols: the p2p handshake
// ("KVFH", metadata/handshake.h) and the PD control channel ("KVFP", pd/control_message.h).
//
//   magic u32 | version u16 | type u16 | payload length u32      (little-endian)
//
// Each protocol describes itself with a FrameFormat (its name for messages, magic, version,
// highest type); decode_frame_header checks a header against it and against the payload
// limit the caller gives (a reader may accept more or less than the protocol's maximum,
// e.g. a handshake request versus a descriptor reply) before anything is allocated.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvferry/status.h"

namespace kvferry {

inline constexpr size_t kFrameHeaderBytes = 12;

struct FrameFormat {
  std::string_view name;  // "handshake", "control": starts every error message
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t max_type = 0;  // types are 1..max_type
};

struct FrameHeader {
  uint32_t magic = 0;
  uint16_t version = 0;
  uint16_t type = 0;
  uint32_t payload_bytes = 0;
};

// Writes the header's fields as they are (no check: tests forge bad headers with it).
void encode_frame_header(const FrameHeader& header, std::span<std::byte, kFrameHeaderBytes> out);
// A header with the format's magic and version.
FrameHeader make_frame_header(const FrameFormat& format, uint16_t type, uint32_t payload_bytes);
// A whole frame: that header, then `payload`.
std::vector<std::byte> make_frame(const FrameFormat& format, uint16_t type,
                                  std::span<const std::byte> payload);

// Checks magic, version, type (1..max_type) and payload_bytes <= max_payload_bytes.
// ProtocolError naming the protocol, the field and its value, e.g.
// "control frame magic 305419896 (expected 1347831371)" or "handshake payload of 9 bytes
// exceeds the limit of 4".
Result<FrameHeader> decode_frame_header(const FrameFormat& format,
                                        std::span<const std::byte> header,
                                        uint32_t max_payload_bytes);

}  // namespace kvferry
