// The value types of a transfer: ops, memory locations and regions, batch states and
// telemetry, and the route an op takes. Plain values shared by the engine's public API and
// the layers below it (transports, metadata), so none of them includes the engine.
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "kvferry/status.h"
#include "kvferry/transport_kind.h"

namespace kvferry {

enum class OpKind : uint8_t { kWrite = 0, kRead = 1 };

// One transfer. WRITE copies [local_addr, +length) to the peer's [remote_addr, +length);
// READ copies the other way.
struct TransferOp {
  OpKind kind = OpKind::kWrite;
  uint64_t local_addr = 0;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
};

// Where a region lives: host memory (pageable or pinned), or device memory of CUDA device
// N (needs a build with CUDA and a device at run time; same-host peers reach it through
// the cuda_ipc transport).
struct MemoryLocation {
  enum class Kind : uint8_t { kHost = 0, kCuda = 1 } kind = Kind::kHost;
  int device = -1;
};

// What a route is chosen by, on each side of an op: host memory the owner allocated itself
// (pageable or pinned), host memory from allocate_shared (same-host peers may map it), or
// device memory.
enum class MemoryKind : uint8_t { kHost = 0, kSharedHost = 1, kDevice = 2 };
inline constexpr size_t kMemoryKindCount = 3;

// "host", "shared_host", "device".
std::string_view memory_kind_name(MemoryKind kind);

// The kind of a region at `location`; `shareable` when it lies in an allocate_shared buffer.
inline MemoryKind memory_kind_of(const MemoryLocation& location, bool shareable) {
  if (location.kind == MemoryLocation::Kind::kCuda) return MemoryKind::kDevice;
  return shareable ? MemoryKind::kSharedHost : MemoryKind::kHost;
}

// How ops from this process's memory of kind `local` to a peer's memory of kind `remote`
// travel: the transport chosen for them, or why none can carry them.
struct Route {
  MemoryKind local = MemoryKind::kHost;
  MemoryKind remote = MemoryKind::kHost;
  std::optional<TransportKind> transport;  // empty: no transport reaches; see `reason`
  std::string reason;                      // why this transport, or why none
};

struct MemoryRegion {
  void* addr = nullptr;
  size_t length = 0;
  MemoryLocation location{};
};

// The longest batch timeout accepted (a day): deadlines stay far from clock overflow.
inline constexpr std::chrono::milliseconds kMaxBatchTimeout{24 * 3600 * 1000};

enum class BatchState : uint8_t { kPending = 0, kCompleted, kFailed };

struct BatchTelemetry {
  uint64_t ops_submitted = 0;
  uint64_t ops_posted = 0;  // after merging
  uint64_t bytes = 0;
  std::chrono::nanoseconds post_time{0};      // submit entry to last op posted
  std::chrono::nanoseconds complete_time{0};  // submit entry to completion (0 while pending)
};

struct BatchStatus {
  BatchState state = BatchState::kPending;
  Status status;  // the error when kFailed
  BatchTelemetry telemetry;
};

}  // namespace kvferry
