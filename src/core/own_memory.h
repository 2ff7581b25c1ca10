// Checked access to this process's own memory at addresses that came from elsewhere: a
// pointer an application passed (the Python API's byte helpers), or registered memory the
// application may have unmapped since it registered it (a tcp receiver landing a peer's
// bytes). The kernel checks the mapping, so an unmapped range, or a read-only one written
// to, is an error naming the address instead of a SIGSEGV.
//
// MemoryMap is what registration checks a range against: the readable mappings of this
// process, read once from /proc/self/maps, so checking many ranges costs one read of that
// file, not a system call per range.
//
// copy_to_own_memory / copy_from_own_memory copy through process_vm_writev/readv to this
// process itself: one system call per copy (however many target ranges), which is how the
// kernel reports a fault (EFAULT) instead of delivering SIGSEGV. Where a seccomp filter
// refuses those calls (ENOSYS, EPERM), they fall back to memcpy, and a bad address crashes
// as it would without them.
//
// Thread-safety: the functions are stateless; a MemoryMap is an immutable value.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/status.h"

namespace kvferry {

class MemoryMap {
 public:
  // The readable mappings of this process now (/proc/self/maps). Where that file cannot be
  // read (no /proc), readable() asks the kernel per range instead (msync), which tells
  // whether a range is mapped but not whether it is readable.
  static MemoryMap of_this_process();
  // The readable mappings listed in /proc/<pid>/maps text. Lines that do not parse are
  // skipped.
  static MemoryMap parse(std::string_view maps_text);

  // Whether every byte of [addr, addr + length) lies in readable mappings. A range that
  // wraps around the address space is not.
  bool readable(uint64_t addr, uint64_t length) const;

 private:
  // Sorted, non-adjacent [start, end) ranges of readable memory.
  std::vector<std::pair<uint64_t, uint64_t>> readable_;
  bool listed_ = true;  // false: /proc/self/maps could not be read
};

// Copies `bytes` from `source` (memory this process knows is mapped, e.g. its own buffer) into
// `targets` in order: target 0 is filled first, and the targets' lengths add up to `bytes`. An
// unmapped or read-only target byte ends the copy with InvalidArgument naming its address;
// the bytes before it may have landed.
Status copy_to_own_memory(std::span<const iovec> targets, const void* source, size_t bytes);
// The same, given this process's id (`self`, what ::getpid() returns), for a thread that copies
// often: it reads the id once, since a thread never changes process, and saves the getpid
// system call per copy (glibc does not cache the id).
Status copy_to_own_memory(pid_t self, std::span<const iovec> targets, const void* source,
                          size_t bytes);

// Copies [source, source + bytes) into `destination` (memory this process knows is mapped and
// writable). An unmapped source byte is InvalidArgument naming its address.
Status copy_from_own_memory(void* destination, const void* source, size_t bytes);

}  // namespace kvferry
