// MappedPages: private anonymous pages a test can unmap one by one (memory registered and
// then unmapped, a hole inside a range), freeing on destruction only what is still its own.
// AnonymousPages: private anonymous memory no one has touched yet (each page missing until
// first used), whose tail a test can make inaccessible in place.
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

// Not on huge pages: one touch must not fill 2 MiB.
class AnonymousPages {
 public:
  explicit AnonymousPages(size_t bytes)
      : bytes_(bytes),
        base_(static_cast<std::byte*>(
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {
    ::madvise(base_, bytes_, MADV_NOHUGEPAGE);
  }
  ~AnonymousPages() { ::munmap(base_, bytes_); }
  AnonymousPages(const AnonymousPages&) = delete;
  AnonymousPages& operator=(const AnonymousPages&) = delete;

  std::byte* data() const { return base_; }
  size_t size() const { return bytes_; }
  // Makes [offset, size()) inaccessible, as memory an application freed without
  // unregistering it; offset is a multiple of the page size. The tail is replaced by an
  // inaccessible mapping in one step, not unmapped: the kernel refuses a write there exactly
  // as into a hole (EFAULT, SIGSEGV), while a hole could be taken by any mapping another
  // thread makes meanwhile (a sanitizer's allocator does that often), and a peer's bytes would
  // then land in it: the hazard freeing registered memory invites, not a case to test.
  void take_away_from(size_t offset) {
    ASSERT_NE(::mmap(base_ + offset, bytes_ - offset, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0),
              MAP_FAILED);
  }

 private:
  size_t bytes_;
  std::byte* base_;
};

}  // namespace kvferry::testing
