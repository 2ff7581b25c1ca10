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
// aligns the same way. The mapping is core/mapped_memory.h's map_memory.
#pragma once

#include <fmt/format.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <string_view>
#include <utility>

#include "core/mapped_memory.h"
#include "kvferry/status.h"

namespace kvferry {

class HostBuffer {
 public:
  // `who` names the caller in the error ("bench engine", "kvferry serve").
  static Result<HostBuffer> map(std::string_view who, uint64_t bytes, bool huge_pages) {
    void* p = map_memory(bytes, huge_pages);
    if (p == nullptr) {
      return ErrnoStatus(StatusCode::kInternal, fmt::format("{}: mmap of {} bytes", who, bytes),
                         errno);
    }
    char* data = static_cast<char*>(p);
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
