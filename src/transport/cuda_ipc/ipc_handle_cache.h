// IpcHandleCache: the peer allocations this process has opened through CUDA IPC handles,
// keyed by (peer incarnation, handle), opened lazily on first use.
//
// cudaIpcOpenMemHandle is expensive (it maps the allocation into this process) and a handle
// must not be opened twice, so every batch to a peer's device memory goes through this
// cache. A peer that restarts has a new incarnation; forget() drops the old one's entries.
// A batch still copying holds its IpcMapping (shared_ptr), so the handle is closed only
// once nothing uses it.
//
// A descriptor is the peer's word: after opening, the cache checks that the allocation
// really is as large as the descriptor claims, so a lying descriptor can never make a copy
// run past the mapping.
//
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "transport/cuda_memory_api.h"
#include "transport/region_index.h"
#include "transport/resolved_op.h"

namespace kvferry::cuda_ipc {

// One opened handle: this process's view of a peer's allocation. Closes it when destroyed.
class IpcMapping {
 public:
  IpcMapping(CudaMemoryApi& api, char* base, uint64_t bytes)
      : api_(api), base_(base), bytes_(bytes) {}
  ~IpcMapping() { api_.close_handle(base_); }
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  char* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }

 private:
  CudaMemoryApi& api_;
  char* base_;
  uint64_t bytes_;
};

class IpcHandleCache {
 public:
  // `api` must outlive the cache and every mapping it hands out.
  explicit IpcHandleCache(CudaMemoryApi& api) : api_(api) {}

  // The mapping of `backing`'s allocation of peer incarnation `incarnation` (on the peer's
  // `device`), opened on first use. ProtocolError if the opened allocation is smaller than
  // the descriptor claims; the API's error if opening fails.
  Result<std::shared_ptr<const IpcMapping>> acquire(uint64_t incarnation,
                                                    const CudaIpcBacking& backing, int device);
  // Drops every entry of `incarnation`; returns how many.
  size_t forget(uint64_t incarnation);
  size_t size() const;

 private:
  using Key = std::pair<uint64_t, IpcHandle>;
  CudaMemoryApi& api_;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<const IpcMapping>> entries_;
};

// Gives every span of `batch` that names a peer's device memory by address only
// (remote == null) this process's pointer to it, opening handles through `cache`. The
// mappings used are appended to `keep_alive` (each once), which must outlive the copies.
// `remote` is the peer's region index the batch was resolved against.
Status map_remote_device_spans(std::span<ResolvedOp> spans, const RegionIndex& remote,
                               IpcHandleCache& cache, uint64_t incarnation,
                               std::vector<std::shared_ptr<const IpcMapping>>& keep_alive);

}  // namespace kvferry::cuda_ipc
