// FakeCudaMemoryApi: a CudaMemoryApi over a table of pretend allocations, so the cuda_ipc
// host-side logic (export checks, handle caching) is tested without a GPU.
#pragma once

#include <map>
#include <mutex>

#include "transport/cuda_ipc/cuda_memory_api.h"

namespace kvferry::cuda_ipc::testing {

class FakeCudaMemoryApi final : public CudaMemoryApi {
 public:
  struct Allocation {
    uint64_t bytes = 0;
    PointerKind kind = PointerKind::kDevice;
    int device = 0;
  };
  // Pretend allocations of this process, by base address.
  std::map<uint64_t, Allocation> allocations;
  // What opening a handle yields: the handle's first byte picks the entry.
  std::map<uint8_t, AllocationRange> openable;
  int opens = 0;
  int closes = 0;
  int last_open_device = -1;

  static IpcHandle handle_for(uint8_t id) {
    IpcHandle h{};
    h[0] = id;
    h[63] = 0xab;
    return h;
  }

  Result<PointerInfo> pointer_info(const void* ptr) override {
    const Allocation* a = find(ptr);
    if (a == nullptr) return PointerInfo{PointerKind::kUnregistered, -1};
    return PointerInfo{a->kind, a->device};
  }
  Result<AllocationRange> allocation_range(const void* ptr) override {
    auto p = reinterpret_cast<uint64_t>(ptr);
    for (const auto& [base, range] : openable) {
      if (p == range.base) return range;
    }
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return Internal("not an allocation");
    --it;
    if (p >= it->first + it->second.bytes) return Internal("not an allocation");
    return AllocationRange{it->first, it->second.bytes};
  }
  Result<IpcHandle> export_handle(void* base, int /*device*/) override {
    return handle_for(static_cast<uint8_t>(reinterpret_cast<uint64_t>(base) >> 20));
  }
  Result<void*> open_handle(const IpcHandle& handle, int device) override {
    auto it = openable.find(handle[0]);
    if (it == openable.end()) return Internal("cudaIpcOpenMemHandle: invalid handle");
    ++opens;
    last_open_device = device;
    return reinterpret_cast<void*>(it->second.base);
  }
  void close_handle(void* /*base*/) override { ++closes; }

 private:
  const Allocation* find(const void* ptr) const {
    auto p = reinterpret_cast<uint64_t>(ptr);
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return nullptr;
    --it;
    return p < it->first + it->second.bytes ? &it->second : nullptr;
  }
};

}  // namespace kvferry::cuda_ipc::testing
