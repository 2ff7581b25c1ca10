// CmaCopier: the copy step of the cma transport — one chunk of a batch (CopyPiece list) moved
// into or out of another process with process_vm_writev / process_vm_readv, up to IOV_MAX
// iovecs per call. probe_cma: whether the kernel lets this process attach to a pid at all.
//
// Pid reuse: the calls address the peer by pid, and a peer that exits and is reaped frees its
// pid for another process (of the same user, or the kernel refuses). The copier therefore
// holds a pidfd of the peer, opened before the probe validated it (open_cma_pidfd), and asks
// it before and after every call: once it reports the exit (POLLIN), no call is made any more
// and the chunk fails with PeerDisconnected; a chunk whose call raced with the exit fails
// too, so nothing read from a reused pid is reported as the peer's bytes. Residual window
// (docs/TRANSPORTS.md, cma trust model): the peer exiting, being reaped, and its pid being
// handed to another process between the check and the call that follows it.
//
// Which ranges: a copier made from a CmaVerifiedPeer (the transport's) copies only into or
// out of ranges the target declared over its verified session, and holds that set steady
// while it copies (transport/cma/cma_session.h). One made from a bare pid (the mechanics
// tests, copying to themselves or to a child) checks nothing.
//
// Thread-safety: copy_chunk may be called concurrently (it keeps no state between calls).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "core/fd.h"
#include "transport/cma/cma_session.h"
#include "transport/local/copy_executor.h"

namespace kvferry {

class CmaCopier final : public ChunkCopier {
 public:
  // `pidfd`: the peer's (open_cma_pidfd), checked around every call; invalid: no check (a
  // kernel without pidfd_open, or a test copying to itself).
  CmaCopier(pid_t pid, std::string peer_name, Fd pidfd = {})
      : pid_(pid), peer_name_(std::move(peer_name)), own_pidfd_(std::move(pidfd)) {}
  // The transport's: the verified pid, its pidfd and its declared ranges.
  explicit CmaCopier(std::shared_ptr<CmaVerifiedPeer> verified)
      : pid_(verified->pid()), peer_name_(verified->peer_name()), verified_(std::move(verified)) {}
  // WRITE pieces go to the peer with process_vm_writev, READ pieces come back with
  // process_vm_readv. Errors: PeerDisconnected (the peer exited: its pidfd says so, or
  // ESRCH), NotRegistered (the peer's range is not declared, or not mapped there: EFAULT),
  // PeerUnreachable (the kernel refuses: EPERM), Internal (anything else), each naming the
  // peer, pid and address.
  Status copy_chunk(std::span<const CopyPiece> pieces) const override;
  // OK while the peer's pidfd reports no exit (or there is no pidfd), else PeerDisconnected.
  Status check_alive() const;

 private:
  int pidfd() const { return verified_ ? verified_->pidfd() : own_pidfd_.get(); }
  Status move_chunk(OpKind kind, iovec* local, size_t nl, iovec* remote, size_t nr) const;

  pid_t pid_;
  std::string peer_name_;
  Fd own_pidfd_;
  std::shared_ptr<CmaVerifiedPeer> verified_;
};

// pidfd_open(pid): the handle that tells whether *this* process (not a later one with the
// same pid) has exited. An invalid Fd (with no error) where the kernel has no pidfd_open
// (before 5.3: ENOSYS); PeerDisconnected when no such process exists.
Result<Fd> open_cma_pidfd(pid_t pid, const std::string& peer_name);

// Reads one byte at `probe_addr` of process `pid` (an address it advertises; without one, an
// address that faults: EFAULT still proves the kernel let us in). "" when the kernel permits
// cross-memory attach, else why not, naming the pid and errno.
std::string probe_cma(pid_t pid, std::optional<uint64_t> probe_addr);

}  // namespace kvferry
