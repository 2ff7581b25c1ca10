// The cma session wire format (docs/PROTOCOL.md, "cma sessions") and the small socket
// helpers both of its sides use. Frames use core/frame_header.h with magic "KVFC".
//
// Thread-safety: pure functions, and calls on a caller's socket.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/byte_codec.h"
#include "core/frame_header.h"
#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint32_t kCmaSessionMagic = 0x4346564B;  // "KVFC" as little-endian bytes
inline constexpr uint16_t kCmaSessionVersion = 1;
enum class CmaSessionFrame : uint16_t {
  kChallenge = 1,  // target -> initiator: 32-byte nonce, or empty without a secret
  kOpen = 2,       // initiator -> target: [32-byte proof when challenged]
  kDeclare = 3,    // target -> initiator: u8 StatusCode; OK: u64 incarnation + ranges; else text
  kAdd = 4,        // target -> initiator: ranges now registered
  kRevoke = 5,     // target -> initiator: u64 sequence + ranges no longer registered
  kAck = 6,        // initiator -> target: u64 sequence of the Revoke it applied
};
inline constexpr FrameFormat kCmaSessionFormat{"cma session", kCmaSessionMagic, kCmaSessionVersion,
                                               static_cast<uint16_t>(CmaSessionFrame::kAck)};
// Ranges on the wire: u32 count, then count x (u64 addr, u64 length).
inline constexpr uint32_t kMaxCmaFrameBytes = 16u << 20;  // about a million ranges
inline constexpr size_t kCmaRangeBytes = 2 * sizeof(uint64_t);

struct CmaRange {
  uint64_t addr = 0;
  uint64_t length = 0;
};

std::vector<std::byte> make_cma_frame(CmaSessionFrame type, std::span<const std::byte> payload);
void put_cma_ranges(ByteWriter& w, std::span<const CmaRange> ranges);
// False for a count that does not fit, an empty range, or one that wraps around.
bool get_cma_ranges(ByteReader& r, std::vector<CmaRange>& out);
std::vector<std::byte> cma_declare_frame(const Status& status, uint64_t incarnation,
                                         std::span<const CmaRange> ranges);

// Sends a whole small frame without blocking; false when it did not all go at once.
bool send_now(int fd, std::span<const std::byte> frame);
// Appends what `fd` has to `inbox` without blocking, until `inbox` holds `limit` bytes (the
// rest stays in the socket for the next call). False at end of stream or on an error, with
// `why` said.
bool receive_available(int fd, std::vector<std::byte>& inbox, size_t limit, std::string& why);

}  // namespace kvferry
