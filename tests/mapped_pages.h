// MappedPages: private anonymous pages a test can unmap one by one (memory registered and
// then unmapped, a hole inside a range), freeing on destruction only what is still its own.
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <vector>

namespace kvferry::testing {

inline const size_t kPageBytes = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

struct MappedPages {
  explicit MappedPages(size_t count)
      : base(static_cast<std::byte*>(::mmap(nullptr, count * kPageBytes, PROT_READ | PROT_WRITE,
                                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))),
        mapped(count, true) {}
  ~MappedPages() {  // only what is still ours: another mapping may have filled a hole since
    for (size_t i = 0; i < mapped.size(); ++i) {
      if (mapped[i]) ::munmap(page(i), kPageBytes);
    }
  }
  MappedPages(const MappedPages&) = delete;
  MappedPages& operator=(const MappedPages&) = delete;
  std::byte* page(size_t i) const { return base + i * kPageBytes; }
  void unmap(size_t i) {
    ASSERT_EQ(::munmap(page(i), kPageBytes), 0);
    mapped[i] = false;
  }

  std::byte* base;
  std::vector<bool> mapped;
};

}  // namespace kvferry::testing
