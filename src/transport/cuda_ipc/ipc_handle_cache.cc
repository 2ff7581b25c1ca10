#include "transport/cuda_ipc/ipc_handle_cache.h"

#include <fmt/format.h>

namespace kvferry::cuda_ipc {

Result<std::shared_ptr<const IpcMapping>> IpcHandleCache::acquire(uint64_t incarnation,
                                                                  const CudaIpcBacking& backing,
                                                                  int device) {
  Key key{incarnation, backing.handle};
  std::lock_guard lock(mu_);
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    // Opened under the lock: a handle must never be opened twice, and opens are rare.
    KVF_ASSIGN_OR_RETURN(void* opened, api_.open_handle(backing.handle, device));
    Result<AllocationRange> range = api_.allocation_range(opened);
    const auto base = reinterpret_cast<uint64_t>(opened);
    if (!range.ok() || range->base != base) {
      api_.close_handle(opened);
      if (!range.ok()) return range.status();
      return ProtocolError(fmt::format(
          "IPC handle of peer incarnation {:016x} opened at {:#x}, inside allocation [{:#x}, +{}) "
          "instead of at its start",
          incarnation, base, range->base, range->bytes));
    }
    auto mapping =
        std::make_shared<const IpcMapping>(api_, static_cast<char*>(opened), range->bytes);
    it = entries_.emplace(key, std::move(mapping)).first;
  }
  if (it->second->bytes() < backing.allocation_bytes) {
    return ProtocolError(fmt::format(
        "peer incarnation {:016x} claims an allocation of {} bytes, but its IPC handle maps {}",
        incarnation, backing.allocation_bytes, it->second->bytes()));
  }
  return it->second;
}

size_t IpcHandleCache::forget(uint64_t incarnation) {
  std::vector<std::shared_ptr<const IpcMapping>> dropped;  // closed after the lock is released
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->first.first == incarnation) {
      dropped.push_back(std::move(it->second));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  return dropped.size();
}

size_t IpcHandleCache::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

Status map_remote_device_spans(std::span<ResolvedOp> spans, const RegionIndex& remote,
                               IpcHandleCache& cache, uint64_t incarnation,
                               std::vector<std::shared_ptr<const IpcMapping>>& keep_alive) {
  size_t hint = 0;
  const RegionEntry* last_region = nullptr;
  char* last_start = nullptr;  // this process's pointer to last_region's first byte
  for (size_t i = 0; i < spans.size(); ++i) {
    ResolvedOp& span = spans[i];
    if (span.remote != nullptr) continue;
    const RegionEntry* r = remote.find(span.remote_addr, span.length, hint);
    if (r == nullptr || !r->cuda) {
      return Internal(fmt::format("span {}: remote range [{:#x}, +{}) has no IPC-backed region", i,
                                  span.remote_addr, span.length));
    }
    if (r != last_region) {
      KVF_ASSIGN_OR_RETURN(auto mapping, cache.acquire(incarnation, *r->cuda, r->location.device));
      bool held = false;
      for (const auto& m : keep_alive) held = held || m == mapping;
      if (!held) keep_alive.push_back(mapping);
      last_region = r;
      last_start = mapping->base() + r->cuda->allocation_offset;
    }
    span.remote = last_start + (span.remote_addr - r->addr);
  }
  return Status::Ok();
}

}  // namespace kvferry::cuda_ipc
