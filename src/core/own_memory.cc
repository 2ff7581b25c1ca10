#include "core/own_memory.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <string>

#include "core/fd.h"

namespace kvferry {
namespace {

// Target ranges passed to one process_vm_writev (the kernel takes up to IOV_MAX).
constexpr size_t kIovecsPerCall = 64;
constexpr size_t kMapsReadBytes = size_t{64} << 10;

// process_vm_writev/readv refused by a seccomp filter (or a kernel without them).
bool self_copy_refused(int error) { return error == ENOSYS || error == EPERM; }

bool parse_hex(std::string_view text, uint64_t& out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out, 16);
  return error == std::errc() && end == text.data() + text.size();
}

Status fault(int error, uint64_t addr, uint64_t length, std::string_view access) {
  if (error == EFAULT) {
    return InvalidArgument(
        fmt::format("[{:#x}, +{}) is not mapped {} in this process", addr, length, access));
  }
  return ErrnoStatus(StatusCode::kInternal,
                     fmt::format("copying [{:#x}, +{}) within this process", addr, length), error);
}

}  // namespace

MemoryMap MemoryMap::of_this_process() {
  MemoryMap map;
  Fd fd(::open("/proc/self/maps", O_RDONLY | O_CLOEXEC));
  std::string text;
  bool complete = fd.valid();
  while (complete) {
    const size_t have = text.size();
    text.resize(have + kMapsReadBytes);
    const ssize_t n = ::read(fd.get(), text.data() + have, kMapsReadBytes);
    if (n < 0 && errno == EINTR) {
      text.resize(have);
      continue;
    }
    text.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n <= 0) complete = n == 0;
    if (n == 0) break;
  }
  if (!complete) {
    map.listed_ = false;
    return map;
  }
  return parse(text);
}

MemoryMap MemoryMap::parse(std::string_view maps_text) {
  MemoryMap map;
  while (!maps_text.empty()) {
    const size_t eol = maps_text.find('\n');
    std::string_view line = maps_text.substr(0, eol);
    maps_text.remove_prefix(eol == std::string_view::npos ? maps_text.size() : eol + 1);
    // "start-end perms offset dev inode [path]", addresses in hex.
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash == std::string_view::npos || space == std::string_view::npos || dash > space ||
        space + 1 >= line.size()) {
      continue;
    }
    uint64_t start = 0;
    uint64_t end = 0;
    if (!parse_hex(line.substr(0, dash), start) ||
        !parse_hex(line.substr(dash + 1, space - dash - 1), end) || end <= start ||
        line[space + 1] != 'r') {
      continue;
    }
    if (!map.readable_.empty() && map.readable_.back().second == start) {
      map.readable_.back().second = end;
    } else {
      map.readable_.emplace_back(start, end);
    }
  }
  // The kernel lists mappings in address order; sort anyway so a test's text need not be.
  if (!std::is_sorted(map.readable_.begin(), map.readable_.end())) {
    std::sort(map.readable_.begin(), map.readable_.end());
  }
  return map;
}

bool MemoryMap::readable(uint64_t addr, uint64_t length) const {
  const uint64_t span = std::max<uint64_t>(length, 1);
  if (addr + span < addr) return false;
  if (!listed_) {
    const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    const uint64_t start = addr & ~(page - 1);
    // ENOMEM: part of the range is not mapped. MS_ASYNC flushes nothing.
    return ::msync(reinterpret_cast<void*>(start), addr + span - start, MS_ASYNC) == 0;
  }
  // The last range starting at or below addr must reach past the range's end (ranges are
  // merged where they touch, so one range covers any readable span).
  auto it = std::upper_bound(readable_.begin(), readable_.end(), addr,
                             [](uint64_t a, const auto& range) { return a < range.first; });
  if (it == readable_.begin()) return false;
  --it;
  return addr + span <= it->second;
}

Status copy_to_own_memory(std::span<const iovec> targets, const void* source, size_t bytes) {
  return copy_to_own_memory(::getpid(), targets, source, bytes);
}

Status copy_to_own_memory(pid_t self, std::span<const iovec> targets, const void* source,
                          size_t bytes) {
  const auto* from = static_cast<const char*>(source);
  size_t done = 0;
  size_t first = 0;  // the target being filled, and how much of it is
  size_t skip = 0;
  auto advance = [&](size_t n) {
    done += n;
    while (n != 0 && first < targets.size()) {
      const size_t take = std::min(n, targets[first].iov_len - skip);
      skip += take;
      n -= take;
      if (skip == targets[first].iov_len) {
        ++first;
        skip = 0;
      }
    }
  };
  // Filled up to the count passed: not zeroed per call.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kIovecsPerCall> remote;
  while (done < bytes) {
    size_t count = 0;
    size_t want = 0;
    for (size_t i = first; i < targets.size() && count < kIovecsPerCall; ++i) {
      const size_t offset = i == first ? skip : 0;
      remote[count++] = {static_cast<char*>(targets[i].iov_base) + offset,
                         targets[i].iov_len - offset};
      want += targets[i].iov_len - offset;
    }
    want = std::min(want, bytes - done);
    if (want == 0) {
      return Internal(fmt::format("copy of {} bytes given targets of only {}", bytes, done));
    }
    iovec local{const_cast<char*>(from + done), want};
    const ssize_t n = ::process_vm_writev(self, &local, 1, remote.data(), count, 0);
    if (n > 0) {
      advance(static_cast<size_t>(n));
      continue;
    }
    const int error = n == 0 ? EFAULT : errno;
    if (error == EINTR) continue;
    if (!self_copy_refused(error)) {
      const auto at = reinterpret_cast<uint64_t>(remote[0].iov_base);
      return fault(error, at, remote[0].iov_len, "writable");
    }
    // No system call to ask: plain copies.
    while (done < bytes) {
      const size_t take = std::min(targets[first].iov_len - skip, bytes - done);
      std::memcpy(static_cast<char*>(targets[first].iov_base) + skip, from + done, take);
      advance(take);
    }
  }
  return Status::Ok();
}

Status copy_from_own_memory(void* destination, const void* source, size_t bytes) {
  const pid_t self = ::getpid();
  size_t done = 0;
  while (done < bytes) {
    iovec local{static_cast<char*>(destination) + done, bytes - done};
    iovec remote{const_cast<char*>(static_cast<const char*>(source)) + done, bytes - done};
    const ssize_t n = ::process_vm_readv(self, &local, 1, &remote, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int error = n == 0 ? EFAULT : errno;
    if (error == EINTR) continue;
    if (!self_copy_refused(error)) {
      return fault(error, reinterpret_cast<uint64_t>(remote.iov_base), remote.iov_len, "readable");
    }
    std::memcpy(local.iov_base, remote.iov_base, remote.iov_len);
    done = bytes;
  }
  return Status::Ok();
}

}  // namespace kvferry
