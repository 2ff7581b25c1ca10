// The tcp transport's wire format: every message starts with a fixed 48-byte header,
// little-endian, followed by `length` payload bytes for kWrite and kReadData frames.
// A vector frame (kWriteV, kReadV) carries many ranges: its `addr` is the entry count n,
// `length` the sum of the entries' lengths, and the header is followed by a table of n
// entries (addr u64 | length u64, kTcpVecEntryBytes each) and, for kWriteV, the entries'
// payloads concatenated in table order. A kReadV is answered by one kReadData carrying the
// concatenated bytes; both are answered as a whole (one Ack / ReadData, whose `addr` names
// the first entry refused when the status is not OK).
//
//   magic u32 "KVFD" | version u16 | type u16 | request_id u64 | addr u64 | length u64 |
//   deadline_ns i64 | status u32 | reserved u32
//
// `addr` is an address in the receiver's registered memory (the target of a kWrite, the
// source of a kRead). `deadline_ns` is the request's deadline on the receiver's
// CLOCK_MONOTONIC (the initiator converts with the clock offset measured at kHello): the
// receiver never writes a byte of a request after it. `status` carries a StatusCode in
// kAck and kReadData. docs/PROTOCOL.md describes the exchanges.
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>

#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint32_t kTcpMagic = 0x4446564B;  // "KVFD" in memory order
// 2: vector frames (kWriteV, kReadV). A peer of another version is refused at kHello.
inline constexpr uint16_t kTcpVersion = 2;
inline constexpr size_t kTcpHeaderBytes = 48;
// A single frame never carries more than this; the initiator splits ops into chunks.
inline constexpr uint64_t kTcpMaxFrameBytes = 64ull << 20;
// A vector frame's table: at most this many entries of kTcpVecEntryBytes each.
inline constexpr uint64_t kTcpMaxVecEntries = 1024;
inline constexpr size_t kTcpVecEntryBytes = 16;
// Challenge and proof sizes of the optional shared-secret authentication.
inline constexpr size_t kTcpNonceBytes = 32;
inline constexpr size_t kTcpProofBytes = 32;

// A steady-clock time as nanoseconds since its epoch (the form atomics and deadlines keep).
inline int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Both ends of a small exchange poll before they sleep: after a lone request of at most
// kTcpHotRequestBytes, the initiator's waiter (for its answer) and the receiver's I/O thread
// (for the next request) poll without sleeping for kTcpHotTime before they block. In a
// request/answer exchange the other side's next move comes sooner than a sleeping thread
// wakes, and on a VM a halted vCPU takes tens of microseconds to wake (polling took one 4 KiB
// op from 34-47 to 12-14 us, one 72 KiB deepseek-v3 page from 98-109 to 28-29 us; docs/
// TRANSPORTS.md, "tcp lanes"). Not after several requests or a larger one: those keep the threads
// busy anyway, and a polling thread would take the core a sender or receiver needs. Bounded, so
// idle ends sleep; and not while polling does not pay: a poll that lost the core, or a spell
// that ran out before anything came, closes the thread's SpinGate (core/spin_gate.h) for a
// back-off, and it sleeps at once until then.
inline constexpr uint64_t kTcpHotRequestBytes = uint64_t{256} << 10;
inline constexpr std::chrono::microseconds kTcpHotTime{100};
// Scratch buffer into which payload bytes that must not land (a refused or expired
// kWrite, an unwanted kReadData) are drained.
inline constexpr size_t kTcpScratchBytes = size_t{64} << 10;
// Payload is received at most this much per recv(), so a request's deadline is checked at
// least that often while its bytes stream in.
inline constexpr uint64_t kTcpReceivePieceBytes = 1 << 20;

enum class TcpFrame : uint16_t {
  kHello = 1,     // initiator -> receiver: deadline_ns = initiator's clock
  kHelloAck = 2,  // receiver -> initiator: request_id = incarnation, deadline_ns = its clock,
                  // addr = its idle timeout in ms (0: none); payload: a nonce when
                  // authentication is on
  kAuth = 3,      // initiator -> receiver: payload = HMAC-SHA256(secret, nonce)
  kWrite = 4,     // payload = the bytes to place at addr
  kRead = 5,      // asks for `length` bytes at addr
  kAck = 6,       // completes a kWrite (or refuses a kHello/kAuth) with `status`
  kReadData = 7,  // answers a kRead or kReadV: payload = the bytes (or length 0 and an error
                  // status)
  kWriteV = 8,    // addr = entry count; table, then the payloads; answered by one kAck
  kReadV = 9,     // addr = entry count; table; answered by one kReadData
};

struct TcpHeader {
  TcpFrame type = TcpFrame::kHello;
  uint64_t request_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  int64_t deadline_ns = 0;
  uint32_t status = 0;
};

void encode_tcp_header(const TcpHeader& header, std::byte* out);
// Checks magic, version, type, and that payload-carrying frames stay within
// kTcpMaxFrameBytes; the error names the bad field and value.
Result<TcpHeader> decode_tcp_header(const std::byte* in);

// Whether frames of this type are followed by `length` payload bytes (after the table, for
// kWriteV).
bool tcp_frame_has_payload(TcpFrame type);

inline bool tcp_frame_is_vector(TcpFrame type) {
  return type == TcpFrame::kWriteV || type == TcpFrame::kReadV;
}

// One range of a vector frame, in the receiver's registered memory.
struct TcpVecEntry {
  uint64_t addr = 0;
  uint64_t length = 0;
};

// The table's size on the wire, for a decoded vector header (whose count is bounded).
inline size_t tcp_table_bytes(const TcpHeader& h) { return h.addr * kTcpVecEntryBytes; }

// Writes entries.size() * kTcpVecEntryBytes bytes at `out`.
void encode_tcp_table(std::span<const TcpVecEntry> entries, std::byte* out);
// Decodes a vector frame's table (tcp_table_bytes(header) bytes at `in`) into `out`, which
// has room for the header's count. Checks that every entry has a length of at least one
// byte that does not wrap its address around, and that the lengths add up to exactly the
// header's `length`; the error names the entry and the bad value.
Status decode_tcp_table(const TcpHeader& header, const std::byte* in, std::span<TcpVecEntry> out);

}  // namespace kvferry
