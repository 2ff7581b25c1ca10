// Large tables the engine builds once and reads often (its registered regions, a peer's
// regions: a few hundred bytes per region) in mappings of their own, backed by transparent
// huge pages.
//
// Memory comes from the kernel a page at a time, each first touch a page fault; on a virtual
// machine a fault costs several microseconds, and a table of 100,000 regions (24 MB) spent
// half its registration time faulting in 4 KiB pages. With 2 MiB pages the same table costs
// a dozen faults. Where the host's THP setting is "madvise" (Debian's default) the kernel
// uses them only when asked; where it is "never" the request is ignored and the table is an
// ordinary mapping.
//
// The tables get their own mappings, not glibc's heap: the request sticks to the address
// range, and a heap range asked for huge pages would hand them (and the kernel's compaction
// on fault) to whatever glibc places there later.
//
// Thread-safety: stateless.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kvferry {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
// Smaller tables come from the ordinary allocator: a mapping of their own would waste most
// of a huge page.
inline constexpr size_t kHugeTableMinBytes = 2 * kHugePageBytes;

// A 2 MiB-aligned anonymous mapping of `bytes` (whole pages), huge pages asked for: only
// aligned 2 MiB of addresses can be one huge page, and the kernel aligns only mappings whose
// length is a multiple of 2 MiB by itself. Nothing is touched. nullptr, errno set, when the
// kernel refuses the mapping.
void* map_huge_pages(size_t bytes);
// Unmaps what map_huge_pages(bytes) returned.
void unmap_huge_pages(void* mapping, size_t bytes);

// A std::allocator that places allocations of kHugeTableMinBytes or more with
// map_huge_pages.
template <class T>
class HugeTableAllocator {
 public:
  using value_type = T;
  HugeTableAllocator() = default;
  template <class U>
  HugeTableAllocator(const HugeTableAllocator<U>& /*other*/) noexcept {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (n * sizeof(T) < kHugeTableMinBytes) return std::allocator<T>().allocate(n);
    void* table = map_huge_pages(n * sizeof(T));
    if (table == nullptr) throw std::bad_alloc();
    return static_cast<T*>(table);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugeTableMinBytes) {
      std::allocator<T>().deallocate(p, n);
      return;
    }
    unmap_huge_pages(p, n * sizeof(T));
  }
  friend bool operator==(const HugeTableAllocator& /*a*/, const HugeTableAllocator& /*b*/) {
    return true;
  }
};

}  // namespace kvferry
