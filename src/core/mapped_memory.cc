#include "core/mapped_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

namespace kvferry {

void* map_memory(size_t bytes, bool huge_pages) {
  if (!huge_pages) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  // Mapped one huge page longer, then the unaligned edges given back (munmap of whole pages
  // of a mapping this owns cannot fail).
  void* raw = ::mmap(nullptr, bytes + kHugePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  const uintptr_t head = aligned - start;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t kept = (bytes + page - 1) / page * page;  // what mmap rounded `bytes` to
  if (head > 0) (void)::munmap(raw, head);
  if (const uintptr_t tail = kHugePageBytes - head; tail > 0) {
    (void)::munmap(reinterpret_cast<void*>(aligned + kept), tail);
  }
  // A request, not a condition: EINVAL where the kernel has no THP.
  (void)::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void unmap_memory(void* mapping, size_t bytes) { (void)::munmap(mapping, bytes); }

}  // namespace kvferry
