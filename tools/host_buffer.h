// HostBuffer: anonymous host memory the tools map for themselves (a KV pool, a serve child's
// buffer, a bench's source and destinations), unmapped when it goes. `huge_pages` advises
// transparent huge pages (MADV_HUGEPAGE: the kernel backs what it can with 2 MiB pages, which
// cma pins far faster than 4 KiB ones); it is advice, so a kernel without THP just ignores
// it. Pages are not touched here: the first write faults them in.
//
// With `huge_pages` the mapping starts on a 2 MiB boundary (kHugePageBytes): a huge page
// covers only an aligned 2 MiB of addresses, so an unaligned start leaves the head (and the
// tail) on 4 KiB pages. Kernel 6.18 aligns anonymous mappings whose length is a multiple of
// 2 MiB by itself, but not others (a 512 MiB + 4 KiB mapping started 4 KiB before a boundary:
// docs/PERFORMANCE.md, "cma against memcpy and the bare system call"); PyTorch's THP allocator
// aligns the same way. The mapping is over-sized by 2 MiB and the unaligned edges unmapped.
#pragma once

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string_view>
#include <utility>

#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint64_t kHugePageBytes = 2u << 20;

class HostBuffer {
 public:
  // `who` names the caller in the error ("bench engine", "kvferry serve").
  static Result<HostBuffer> map(std::string_view who, uint64_t bytes, bool huge_pages) {
    const uint64_t mapped = huge_pages ? bytes + kHugePageBytes : bytes;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return ErrnoStatus(StatusCode::kInternal, fmt::format("{}: mmap of {} bytes", who, mapped),
                         errno);
    }
    char* data = static_cast<char*>(p);
    if (huge_pages) {
      // Keep [aligned, aligned + bytes); give the rest back (munmap of whole pages of a
      // mapping we own cannot fail).
      const auto start = reinterpret_cast<uintptr_t>(p);
      const uintptr_t aligned = (start + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
      const uint64_t head = aligned - start;
      const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
      const uint64_t kept = (bytes + page - 1) / page * page;  // what mmap rounded `bytes` to
      if (head > 0) (void)::munmap(p, head);
      if (const uint64_t tail = kHugePageBytes - head; tail > 0) {
        (void)::munmap(reinterpret_cast<char*>(aligned) + kept, tail);
      }
      data = reinterpret_cast<char*>(aligned);
      (void)::madvise(data, bytes, MADV_HUGEPAGE);  // advice: best effort
    }
    return HostBuffer(data, bytes);
  }
  HostBuffer(HostBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  HostBuffer& operator=(HostBuffer&&) = delete;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (data_ != nullptr) ::munmap(data_, size_);
  }
  char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  HostBuffer(char* data, uint64_t size) : data_(data), size_(size) {}
  char* data_;
  uint64_t size_;
};

}  // namespace kvferry
