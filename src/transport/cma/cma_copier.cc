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
#include <functional>
#include <utility>

namespace kvferry {
namespace {

// The kernel takes at most IOV_MAX iovecs per side and call (UIO_MAXIOV, 1024 on Linux).
constexpr size_t kMaxIovecs = IOV_MAX;

std::string_view kind_verb(OpKind kind) {
  return kind == OpKind::kWrite ? "process_vm_writev" : "process_vm_readv";
}

// Skips `done` bytes of an iovec list: whole entries, then into the first one left.
void advance(iovec*& v, size_t& n, uint64_t done) {
  while (done > 0 && n > 0) {
    if (done >= v->iov_len) {
      done -= v->iov_len;
      ++v;
      --n;
    } else {
      v->iov_base = static_cast<char*>(v->iov_base) + done;
      v->iov_len -= done;
      done = 0;
    }
  }
}

// Moves the bytes of `local` (nl iovecs) to or from `remote` (nr iovecs, the same total) as
// one stream each side, at most IOV_MAX iovecs per side and call, resuming after partial
// transfers: the kernel stops at the first remote range it cannot touch and reports the bytes
// it moved, and the next call then fails on that range with its errno.
Status move_streams(pid_t pid, const std::string& peer_name, OpKind kind, iovec* local, size_t nl,
                    iovec* remote, size_t nr) {
  while (nl > 0 && nr > 0) {
    const size_t lc = std::min(nl, kMaxIovecs);
    const size_t rc_count = std::min(nr, kMaxIovecs);
    const ssize_t rc = kind == OpKind::kWrite
                           ? ::process_vm_writev(pid, local, lc, remote, rc_count, 0)
                           : ::process_vm_readv(pid, local, lc, remote, rc_count, 0);
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
    advance(local, nl, static_cast<uint64_t>(rc));
    advance(remote, nr, static_cast<uint64_t>(rc));
  }
  return Status::Ok();
}

// Appends [base, base + len) to the n iovecs of `v`, extending the last one when it ends there.
void append_range(iovec* v, size_t& n, char* base, size_t len) {
  if (n > 0 && static_cast<char*>(v[n - 1].iov_base) + v[n - 1].iov_len == base) {
    v[n - 1].iov_len += len;
  } else {
    v[n++] = iovec{base, len};
  }
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
  if (pidfd() < 0) return Status::Ok();
  pollfd p{pidfd(), POLLIN, 0};
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
  std::array<std::pair<uint64_t, uint32_t>, kMaxChunkPieces> order;  // (peer address, piece)
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kMaxChunkPieces> local;
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<iovec, kMaxChunkPieces> remote;
  size_t i = 0;
  while (i < pieces.size()) {
    // One call per run of pieces of the same kind (a batch may mix WRITE and READ ops).
    const OpKind kind = pieces[i].span->kind;
    size_t n = 0;
    for (; i < pieces.size() && pieces[i].span->kind == kind && n < order.size(); ++i) {
      const CopyPiece& p = pieces[i];
      if (p.length > 0) order[n++] = {p.span->remote_addr + p.offset, static_cast<uint32_t>(i)};
    }
    // The kernel's cost is per remote range (it pins the peer's pages range by range), the
    // local side is a plain user copy, and the two sides are separate iovec lists that only
    // have to carry the same bytes in the same order. So the pieces go in the peer's address
    // order, and pieces adjacent there become one remote iovec however scattered they are
    // here: a gather into, or a scatter from, contiguous peer memory costs one range. The
    // order cannot change what lands: the destinations of a batch never overlap (submit
    // checks them: docs/PROTOCOL.md, "Batch states").
    const auto first = order.begin();
    const auto last = first + static_cast<std::ptrdiff_t>(n);
    if (!std::is_sorted(first, last)) {
      if (std::is_sorted(first, last, std::greater<>())) {
        std::reverse(first, last);  // a descending layout needs no sort
      } else {
        std::sort(first, last);
      }
    }
    size_t nl = 0;
    size_t nr = 0;
    for (auto k = first; k != last; ++k) {
      const CopyPiece& p = pieces[k->second];
      append_range(local.data(), nl, p.span->local + p.offset, p.length);
      append_range(remote.data(), nr, reinterpret_cast<char*>(k->first), p.length);
    }
    if (verified_) {
      KVF_RETURN_IF_ERROR(verified_->copy_within(std::span<const iovec>(remote.data(), nr), [&] {
        return move_chunk(kind, local.data(), nl, remote.data(), nr);
      }));
    } else {
      KVF_RETURN_IF_ERROR(move_chunk(kind, local.data(), nl, remote.data(), nr));
    }
  }
  return Status::Ok();
}

Status CmaCopier::move_chunk(OpKind kind, iovec* local, size_t nl, iovec* remote, size_t nr) const {
  KVF_RETURN_IF_ERROR(check_alive());
  Status moved = move_streams(pid_, peer_name_, kind, local, nl, remote, nr);
  // Checked after the call too: a call that raced with the exit may have reached another
  // process holding the pid by now, and what it read is not the peer's.
  KVF_RETURN_IF_ERROR(check_alive());
  return moved;
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
