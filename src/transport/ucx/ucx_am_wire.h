// The ucx transport's active-message protocol, used where the path to a peer is emulated
// (no hardware RMA on both sides): what each AM header carries, which data path a peer
// gets, and the target's check of a request. Pure functions, so the decisions are
// unit-tested without a second process.
//
// Every AM carries one fixed 40-byte header (host byte order: both ends run on x86-64 or
// both on aarch64; a size mismatch is a ProtocolError):
//
//   request_id u64 | addr u64 | length u64 | deadline_ns i64 | status u32 | reserved u32
//
//   kPing      initiator -> target: deadline_ns = the initiator's clock (sent with REPLY)
//   kPong      target -> initiator: deadline_ns = the target's clock when it answered
//   kWrite     initiator -> target: put `length` data bytes at `addr` (eager or rendezvous),
//              unless `addr` is outside the target's registered regions or the target's
//              clock is past `deadline_ns` (the batch deadline converted with the offset
//              measured by kPing): then the data is dropped
//   kWriteAck  target -> initiator: `status` is the verdict (OK: the data landed; a
//              rendezvous write is received into a buffer of the target's and answered once
//              it is in and copied, or refused with Timeout when it took longer than the
//              target's frame-rest timeout)
//   kRead      initiator -> target: asks for `length` bytes at `addr` by `deadline_ns`
//   kReadReply target -> initiator: `status`, and on OK the `length` bytes as data; the
//              initiator lands them only while the op's batch is live
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>

#include "core/net.h"
#include "kvferry/status.h"
#include "transport/region_index.h"

namespace kvferry::detail {

enum class UcxAmId : uint16_t {
  kPing = 1,
  kPong = 2,
  kWrite = 3,
  kWriteAck = 4,
  kRead = 5,
  kReadReply = 6,
};
inline constexpr UcxAmId kFirstUcxAmId = UcxAmId::kPing;
inline constexpr UcxAmId kLastUcxAmId = UcxAmId::kReadReply;

inline constexpr size_t kUcxAmHeaderBytes = 40;
// The most data one kWrite carries (the initiator's chunk); a target refuses more, so what a
// rendezvous write buffers is bounded.
inline constexpr uint64_t kUcxMaxAmWriteBytes = 8ull << 20;
// Payloads up to this size (a kWrite's data, a kReadReply's) are sent eager
// (UCP_AM_SEND_FLAG_EAGER), larger ones as UCX chooses (rendezvous). Endpoints are created
// with peer-failure handling, and under it UCX does not give rendezvous its zero-copy lanes
// on transports that cannot invalidate memory (tcp): a rendezvous there is one more round
// trip (request, ready) before fragments copied as eager ones would be. Measured on UCX's tcp
// (loopback, 1 thread, 128 ops per batch), eager against rendezvous: 64 KiB 2.9 against 1.7
// GB/s, 1 MiB 4.2 against 3.4; from 4 MiB on no difference beyond the spread, and a larger
// eager payload is assembled in a buffer UCX allocates for it, where a rendezvous one lands
// in the worker's reused landing buffers.
inline constexpr uint64_t kUcxAmEagerMaxBytes = 1ull << 20;

struct UcxAmHeader {
  uint64_t request_id = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  int64_t deadline_ns = 0;
  uint32_t status = 0;  // a StatusCode (replies)
};

using UcxAmHeaderBytes = std::array<std::byte, kUcxAmHeaderBytes>;

UcxAmHeaderBytes encode_ucx_am_header(const UcxAmHeader& h);
// ProtocolError naming the size when it is not kUcxAmHeaderBytes, or a bad status code.
Result<UcxAmHeader> decode_ucx_am_header(const void* bytes, size_t size);

// How bytes move to a peer: UCX put/get where the NIC checks rkeys on both sides, else
// kvferry's active messages (the target's handler checks every request). The one place
// the choice is made.
enum class UcxDataPath : uint8_t { kRma, kActiveMessages };
UcxDataPath choose_ucx_data_path(bool local_hardware_rma, bool peer_hardware_rma);
const char* ucx_data_path_name(UcxDataPath path);

// A time on this process's monotonic clock (Clock, CLOCK_MONOTONIC) in nanoseconds.
int64_t ucx_clock_ns(Clock::time_point t);
// The clock offset measured by a kPing sent at our `sent_ns` and answered at the target's
// `target_ns`, received at our `received_ns`: the target's clock minus ours, the smallest
// value consistent with the round trip, so a converted deadline is early, never late.
int64_t ucx_clock_offset_ns(int64_t target_ns, int64_t received_ns);
// A batch deadline on the target's clock (saturating: a deadline too far to convert stays
// the latest time).
int64_t ucx_target_deadline_ns(Clock::time_point deadline, int64_t offset_ns);

// A reply's verdict as a Status (OK, or the code with a message naming the peer and what
// was refused).
Status ucx_am_reply_status(uint32_t status_code, std::string_view peer, std::string_view what);

// A range of this engine's registered memory pinned for one AM request (see RegionUse): the
// region cannot be unregistered until release().
struct UcxAmPin {
  std::shared_ptr<const RegionIndex> snapshot;
  RegionUse* use = nullptr;
  char* ptr = nullptr;

  UcxAmPin() = default;
  UcxAmPin(std::shared_ptr<const RegionIndex> s, RegionUse* u, char* p)
      : snapshot(std::move(s)), use(u), ptr(p) {}
  UcxAmPin(UcxAmPin&& o) noexcept
      : snapshot(std::move(o.snapshot)), use(std::exchange(o.use, nullptr)), ptr(o.ptr) {}
  UcxAmPin& operator=(UcxAmPin&& o) noexcept;
  UcxAmPin(const UcxAmPin&) = delete;
  UcxAmPin& operator=(const UcxAmPin&) = delete;
  ~UcxAmPin() { release(); }
  void release();
};

// The target's check of a kWrite or kRead: [addr, +length) inside one registered host
// region, not being unregistered, and `now_ns` (the target's clock) at least `margin_ns`
// before `deadline_ns` (a write's: kLandingMarginNs, batch_progress.h; a read's: 0, its bytes
// land on the initiator). NotRegistered or NotSupported naming the range, or Timeout.
Result<UcxAmPin> check_ucx_am_target(const std::shared_ptr<const RegionIndex>& regions,
                                     uint64_t addr, uint64_t length, int64_t deadline_ns,
                                     int64_t now_ns, int64_t margin_ns);

}  // namespace kvferry::detail
