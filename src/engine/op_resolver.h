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
  std::vector<RegionUse*> uses;  // local regions touched (consecutive duplicates removed)
  uint64_t bytes = 0;
};

struct ResolveOutcome {
  Status status;
  // The failure was a remote range outside the peer's regions: a refreshed descriptor
  // may know the region.
  bool remote_miss = false;
  ResolvedBatch batch;
};

// `need_remote_pointer`: the transport copies with memcpy, so every remote region must be
// mapped into this process (host_ptr set); otherwise (tcp) only its address is needed.
ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           bool need_remote_pointer);

}  // namespace kvferry
