// CmaCopier: the copy step of the cma transport — one chunk of a batch (CopyPiece list) moved
// into or out of another process with process_vm_writev / process_vm_readv, up to IOV_MAX
// iovecs per call. probe_cma: whether the kernel lets this process attach to a pid at all.
//
// Thread-safety: copy_chunk may be called concurrently (it keeps no state between calls).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "transport/local/copy_executor.h"

namespace kvferry {

class CmaCopier final : public ChunkCopier {
 public:
  CmaCopier(pid_t pid, std::string peer_name) : pid_(pid), peer_name_(std::move(peer_name)) {}
  // WRITE pieces go to the peer with process_vm_writev, READ pieces come back with
  // process_vm_readv. Errors: PeerDisconnected (the peer exited: ESRCH), NotRegistered (the
  // peer's range is not mapped there any more: EFAULT), PeerUnreachable (the kernel refuses:
  // EPERM), Internal (anything else), each naming the peer, pid and address.
  Status copy_chunk(std::span<const CopyPiece> pieces) const override;

 private:
  pid_t pid_;
  std::string peer_name_;
};

// Reads one byte at `probe_addr` of process `pid` (an address it advertises; without one, an
// address that faults: EFAULT still proves the kernel let us in). "" when the kernel permits
// cross-memory attach, else why not, naming the pid and errno.
std::string probe_cma(pid_t pid, std::optional<uint64_t> probe_addr);

}  // namespace kvferry
