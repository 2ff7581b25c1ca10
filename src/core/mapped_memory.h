// Memory in mappings of its own, for two kinds of allocation glibc's heap serves badly:
//
// * Large tables the engine builds once and reads often (its registered regions, a peer's
//   regions: a few hundred bytes per region), backed by transparent huge pages. Memory comes
//   from the kernel a page at a time, each first touch a page fault; on a virtual machine a
//   fault costs several microseconds, and a table of 100,000 regions (24 MB) spent half its
//   registration time faulting in 4 KiB pages. With 2 MiB pages the same table costs a dozen
//   faults. Where the host's THP setting is "madvise" (Debian's default) the kernel uses them
//   only when asked; where it is "never" the request is ignored. The tables get mappings of
//   their own because the request sticks to the address range: a heap range asked for huge
//   pages would hand them (and the kernel's compaction on fault) to whatever glibc puts there
//   later.
// * Buffers a peer makes this process hold (a control frame on its way in, up to its cap),
//   which must go back to the system when they are freed. glibc keeps what a thread's arena
//   freed at the top of that arena unless it exceeds a threshold that grows with the largest
//   block freed so far, and malloc_trim does not shrink other threads' arenas: a flood of
//   held frames could leave megabytes resident after it ended, depending on what ran before.
//
// Thread-safety: stateless.
#pragma once

#include <cstddef>
#include <memory>
#include <new>

namespace kvferry {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// An anonymous mapping of `bytes` (whole pages); with `huge_pages`, 2 MiB-aligned and huge
// pages asked for (only aligned 2 MiB of addresses can be one huge page, and the kernel
// aligns only mappings whose length is a multiple of 2 MiB by itself). Nothing is touched.
// nullptr, errno set, when the kernel refuses the mapping.
void* map_memory(size_t bytes, bool huge_pages);
// Unmaps what map_memory(bytes, ...) returned.
void unmap_memory(void* mapping, size_t bytes);

// A std::allocator that places allocations of Use::kMinBytes or more with map_memory (huge
// pages as Use::kHugePages says), smaller ones with std::allocator.
template <class T, class Use>
class MappedAllocator {
 public:
  using value_type = T;
  MappedAllocator() = default;
  template <class U>
  MappedAllocator(const MappedAllocator<U, Use>& /*other*/) noexcept {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (n * sizeof(T) < Use::kMinBytes) return std::allocator<T>().allocate(n);
    void* mapping = map_memory(n * sizeof(T), Use::kHugePages);
    if (mapping == nullptr) throw std::bad_alloc();
    return static_cast<T*>(mapping);
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < Use::kMinBytes) {
      std::allocator<T>().deallocate(p, n);
      return;
    }
    unmap_memory(p, n * sizeof(T));
  }
  friend bool operator==(const MappedAllocator& /*a*/, const MappedAllocator& /*b*/) {
    return true;
  }
};

// Large tables: from 4 MiB (smaller ones would waste most of a huge page), on huge pages.
struct HugeTables {
  static constexpr size_t kMinBytes = 2 * kHugePageBytes;
  static constexpr bool kHugePages = true;
};
template <class T>
using HugeTableAllocator = MappedAllocator<T, HugeTables>;

// Buffers a peer makes this process hold: from 64 KiB (a mapping per smaller one would cost
// more than it keeps), returned to the system when freed.
struct ReturnedBuffers {
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr bool kHugePages = false;
};
template <class T>
using ReturnedAllocator = MappedAllocator<T, ReturnedBuffers>;

}  // namespace kvferry
