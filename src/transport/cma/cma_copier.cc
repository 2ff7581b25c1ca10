#include "transport/cma/cma_copier.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/syscall.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>

namespace kvferry {
namespace {

// The kernel takes at most IOV_MAX iovecs per side and call (UIO_MAXIOV, 1024 on Linux).
constexpr size_t kMaxIovecs = IOV_MAX;

std::string_view kind_verb(OpKind kind) {
  return kind == OpKind::kWrite ? "process_vm_writev" : "process_vm_readv";
}

// Moves n iovec pairs of one kind (local[i] and remote[i] have equal lengths), resuming after
// partial transfers: the kernel stops at the first remote range it cannot touch and reports
// the bytes it moved, and the next call then fails on that range with its errno.
Status move_iovecs(pid_t pid, const std::string& peer_name, OpKind kind, iovec* local,
                   iovec* remote, size_t n) {
  while (n > 0) {
    const size_t count = std::min(n, kMaxIovecs);
    const ssize_t rc = kind == OpKind::kWrite
                           ? ::process_vm_writev(pid, local, count, remote, count, 0)
                           : ::process_vm_readv(pid, local, count, remote, count, 0);
    if (rc < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      const auto addr = reinterpret_cast<uint64_t>(remote->iov_base);
      const std::string where = fmt::format("{} bytes at {:#x} of peer {} (pid {})",
                                            remote->iov_len, addr, peer_name, pid);
      switch (err) {
        case ESRCH:
          return PeerDisconnected(
              fmt::format("cma: {} of {}: the process has exited", kind_verb(kind), where));
        case EFAULT:
          return NotRegistered(
              fmt::format("cma: {} of {}: not mapped in the peer (it advertised the range)",
                          kind_verb(kind), where));
        case EPERM:
          return PeerUnreachable(
              fmt::format("cma: {} of {}: the kernel refuses cross-memory attach (EPERM)",
                          kind_verb(kind), where));
        default:
          return Internal(
              fmt::format("cma: {} of {}: {}", kind_verb(kind), where, std::strerror(err)));
      }
    }
    if (rc == 0) {
      return Internal(fmt::format("cma: {} moved no byte of {} bytes at {:#x} of peer {}",
                                  kind_verb(kind), remote->iov_len,
                                  reinterpret_cast<uint64_t>(remote->iov_base), peer_name));
    }
    auto done = static_cast<uint64_t>(rc);
    while (done > 0 && n > 0) {
      if (done >= local->iov_len) {
        done -= local->iov_len;
        ++local;
        ++remote;
        --n;
      } else {
        local->iov_base = static_cast<char*>(local->iov_base) + done;
        local->iov_len -= done;
        remote->iov_base = static_cast<char*>(remote->iov_base) + done;
        remote->iov_len -= done;
        done = 0;
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Result<Fd> open_cma_pidfd(pid_t pid, const std::string& peer_name) {
  Fd fd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (fd.valid()) return fd;
  const int err = errno;
  if (err == ENOSYS) return Fd{};
  if (err == ESRCH) {
    return PeerDisconnected(fmt::format("cma: peer {} (pid {}) has exited", peer_name, pid));
  }
  return Internal(
      fmt::format("cma: pidfd_open of peer {} (pid {}): {}", peer_name, pid, std::strerror(err)));
}

Status CmaCopier::check_alive() const {
  if (!pidfd_.valid()) return Status::Ok();
  pollfd p{pidfd_.get(), POLLIN, 0};
  int rc = 0;
  do {
    rc = ::poll(&p, 1, 0);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) return Status::Ok();
  // Readable (the process exited), or poll itself failed: either way no call may follow.
  return PeerDisconnected(fmt::format(
      "cma: peer {} (pid {}) has exited; nothing more is copied to or from its pid, which "
      "another process may now hold",
      peer_name_, pid_));
}

Status CmaCopier::copy_chunk(std::span<const CopyPiece> pieces) const {
  // Filled up to the count each call passes: not zeroed per chunk.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kMaxChunkPieces> local;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kMaxChunkPieces> remote;
  size_t i = 0;
  while (i < pieces.size()) {
    // One call per run of pieces of the same kind (a batch may mix WRITE and READ ops).
    const OpKind kind = pieces[i].span->kind;
    size_t n = 0;
    for (; i < pieces.size() && pieces[i].span->kind == kind && n < local.size(); ++i) {
      const CopyPiece& p = pieces[i];
      if (p.length == 0) continue;
      local[n] = iovec{p.span->local + p.offset, p.length};
      remote[n] = iovec{reinterpret_cast<char*>(p.span->remote_addr) + p.offset, p.length};
      ++n;
    }
    KVF_RETURN_IF_ERROR(check_alive());
    Status moved = move_iovecs(pid_, peer_name_, kind, local.data(), remote.data(), n);
    // Checked after the call too: a call that raced with the exit may have reached another
    // process holding the pid by now, and what it read is not the peer's.
    KVF_RETURN_IF_ERROR(check_alive());
    KVF_RETURN_IF_ERROR(moved);
  }
  return Status::Ok();
}

std::string probe_cma(pid_t pid, std::optional<uint64_t> probe_addr) {
  if (pid <= 0) return fmt::format("the peer advertises no usable pid ({})", pid);
  char byte = 0;
  iovec local{&byte, 1};
  // Address 0 is never mapped: with no advertised region, EFAULT is the permitted answer.
  iovec remote{reinterpret_cast<void*>(probe_addr.value_or(0)), 1};
  if (::process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1) return "";
  const int err = errno;
  switch (err) {
    case EFAULT:
      if (!probe_addr) return "";
      return fmt::format(
          "the probe read of the region it advertises at {:#x} faulted in pid {} (EFAULT)",
          *probe_addr, pid);
    case EPERM:
      return fmt::format(
          "the kernel refuses cross-memory attach to pid {} (EPERM: ptrace access check — "
          "another user, a process that is not dumpable, or kernel.yama.ptrace_scope)",
          pid);
    case ESRCH: return fmt::format("no process {} in this pid namespace (ESRCH)", pid);
    case ENOSYS: return "this kernel has no process_vm_readv (ENOSYS)";
    default: return fmt::format("process_vm_readv probe of pid {}: {}", pid, std::strerror(err));
  }
}

}  // namespace kvferry
