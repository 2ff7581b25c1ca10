// ResolvedOp: one op after the engine checked it against the regions of both sides (and
// merged it with its neighbours), as a transport receives it: pointers this process can
// use, and the peer's address of the remote range.
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>

#include "kvferry/transfer_types.h"

namespace kvferry {

struct RegionEntry;

struct ResolvedOp {
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;     // this process's pointer to the local range
  uint64_t remote_addr = 0;  // the peer's address of the remote range
  char* remote = nullptr;    // this process's pointer to it (shm, local), or null (tcp)
  uint64_t length = 0;
  // The peer's shm region the remote range lies in, or null: its entry in the peer's region
  // snapshot the batch holds (so it outlives the copies), whose guard word must still hold
  // the entry's generation after each copy (ShmBacking). One pointer where the guard and
  // the generation took two words: a million-op batch writes and reads these records
  // through memory, not cache.
  const RegionEntry* remote_shm = nullptr;

  char* dst() const { return kind == OpKind::kWrite ? remote : local; }
  const char* src() const { return kind == OpKind::kWrite ? local : remote; }
};

// What a transport can touch of an op's two ranges; the engine refuses an op routed to a
// transport that cannot reach one of them.
enum class CopyAccess : uint8_t {
  // tcp (without CUDA), cma, ucx: the remote range by address only; both sides must be host
  // memory.
  kRemoteAddress,
  // tcp in a CUDA build: the remote range by address only; host or device memory on either
  // side (device memory is staged through pinned host buffers on each side).
  kStagedRemoteAddress,
  // memcpy (local, shm): host memory on both sides, every remote region mapped here.
  kHostPointers,
  // device copies (cuda_ipc): host or device memory on either side. A remote host region
  // must be mapped here; a remote device region may be unmapped (remote == null) if it
  // carries an IPC handle, which the transport opens before copying.
  kDevicePointers,
};

}  // namespace kvferry
