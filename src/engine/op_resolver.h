// resolve_ops: the check-then-merge step every batch goes through before any byte moves.
//
// Each op is checked against the local regions (its local range inside one region) and
// the peer's regions (its remote range inside one advertised region), translated to
// (dst, src) pointers this process can copy between, and merged with the previous op
// when both sides continue it contiguously inside the same two regions.
//
// Thread-safety: pure function over immutable inputs.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/region_index.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry {

// One checked (and possibly merged) op.
struct ResolvedOp {
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;     // this process's pointer to the local range
  uint64_t remote_addr = 0;  // the peer's address of the remote range
  char* remote = nullptr;    // this process's pointer to it (shm, local), or null (tcp)
  uint64_t length = 0;

  char* dst() const { return kind == OpKind::kWrite ? remote : local; }
  const char* src() const { return kind == OpKind::kWrite ? local : remote; }
};

struct ResolvedBatch {
  std::vector<ResolvedOp> spans;  // after merging
  std::vector<RegionUse*> uses;   // local regions touched (consecutive duplicates removed)
  uint64_t bytes = 0;
  bool touches_device = false;  // some op reads or writes cuda memory (local or remote)
};

// What the transport that will run a batch can touch.
enum class CopyAccess : uint8_t {
  // tcp: the remote range by address only; both sides must be host memory.
  kRemoteAddress,
  // memcpy (local, shm): host memory on both sides, every remote region mapped here.
  kHostPointers,
  // device copies (cuda_ipc): host or device memory on either side. A remote host region
  // must be mapped here; a remote device region may be unmapped (remote == null) if it
  // carries an IPC handle, which the transport opens before copying.
  kDevicePointers,
};

struct ResolveOutcome {
  Status status;
  // The failure was a remote range outside the peer's regions: a refreshed descriptor
  // may know the region.
  bool remote_miss = false;
  ResolvedBatch batch;
};

// `access` says which regions the transport can reach (see CopyAccess); an op touching
// one it cannot is NotSupported, naming the op, the region and why.
ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           CopyAccess access);

}  // namespace kvferry
