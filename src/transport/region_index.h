// RegionIndex: an immutable, sorted set of registered regions with containment lookup.
//
// The engine keeps its own regions as a RegionIndex snapshot that registration replaces
// (copy-on-write), so the data path reads it without a lock; a peer's advertised regions
// are a RegionIndex too, whose host_ptr points into this process's mapping of them (or is
// null when this process cannot touch them directly, e.g. a peer's device memory, which
// the cuda_ipc transport maps lazily through its IPC handle). For a local cuda region,
// host_ptr is the device pointer: only device copies may use it.
//
// Thread-safety: immutable after construction; RegionUse counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/mapped_memory.h"
#include "kvferry/transfer_types.h"
#include "metadata/segment_descriptor.h"

namespace kvferry {

// Tracks batches in flight on a local region so unregistering it can be refused.
// Protocol (both sides seq_cst): a batch increments in_flight, then checks removed;
// unregister sets removed, then checks in_flight. One of them always sees the other.
struct RegionUse {
  std::atomic<int64_t> in_flight{0};
  std::atomic<bool> removed{false};
};

struct RegionEntry {
  uint64_t addr = 0;
  uint64_t length = 0;
  char* host_ptr = nullptr;  // this process's pointer to byte `addr`, or null
  MemoryLocation location{};
  std::optional<ShmBacking> shm;       // local regions inside an allocate_shared buffer
  std::shared_ptr<RegionUse> use;      // local regions only
  std::optional<CudaIpcBacking> cuda;  // device memory exported through CUDA IPC
  std::string ucx_rkey{};              // packed UCX rkey (ucx: register_region), or empty
  // A peer's shm region: its guard word in this process's mapping, which holds
  // shm->generation while the peer keeps the region registered (transport/shm_mapping.h).
  uint64_t* shm_guard = nullptr;
  uint64_t end() const { return addr + length; }
  // What routes are chosen by: device memory, memory a same-host peer may map, or other host
  // memory.
  MemoryKind kind() const { return memory_kind_of(location, shm.has_value()); }
};

// A table of up to a few hundred thousand entries, built once per registration or handshake:
// large ones in huge pages (core/mapped_memory.h).
using RegionEntries = std::vector<RegionEntry, HugeTableAllocator<RegionEntry>>;

class RegionIndex {
 public:
  RegionIndex() = default;
  // `entries` must be sorted by addr and non-overlapping.
  explicit RegionIndex(RegionEntries entries) : entries_(std::move(entries)) {}

  // The region containing all of [addr, addr + length), or nullptr. `hint` is the index
  // of the last hit, tried first: runs of ops in one region cost one compare.
  const RegionEntry* find(uint64_t addr, uint64_t length, size_t& hint) const {
    if (hint < entries_.size() && contains(entries_[hint], addr, length)) return &entries_[hint];
    return find_slow(addr, length, hint);
  }
  // Any region intersecting [addr, addr + length).
  const RegionEntry* find_overlap(uint64_t addr, uint64_t length) const;
  // The region starting exactly at addr.
  const RegionEntry* find_start(uint64_t addr) const;

  std::span<const RegionEntry> entries() const { return entries_; }

 private:
  static bool contains(const RegionEntry& r, uint64_t addr, uint64_t length) {
    return addr >= r.addr && addr - r.addr <= r.length && length <= r.length - (addr - r.addr);
  }
  const RegionEntry* find_slow(uint64_t addr, uint64_t length, size_t& hint) const;

  RegionEntries entries_;
};

}  // namespace kvferry
