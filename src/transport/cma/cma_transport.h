// The cma transport: ops to a same-host peer's host memory — any memory it registered, not
// only allocate_shared memory — moved with one system call per chunk (process_vm_writev /
// process_vm_readv, "cross-memory attach"): the kernel copies straight between the two
// address spaces, one copy, no mapping and no staging.
//
// Reach: a peer on this host and in this pid namespace (its descriptor's host id is ours:
// core/host_identity.h, which encodes the boot id and the pid namespace), host or shared-host
// memory on both sides. The kernel allows the calls only where ptrace would be allowed
// (PTRACE_MODE_ATTACH_REALCREDS: the same user, or CAP_SYS_PTRACE; Yama's ptrace_scope may
// restrict it further), so connect() probes once per peer with a one-byte process_vm_readv of a
// region the peer advertises; a refused probe makes connect() fail with the kernel's reason,
// which the engine's route table reports, and the route goes to the next transport (tcp).
//
// Trust model: cma is one-sided and the target runs nothing, so the target cannot re-check
// ranges. The initiator checks every op against the peer's advertised regions (as for shm),
// but a process the kernel lets attach to the peer could write any of its memory anyway; cma
// adds no exposure beyond what the kernel's ptrace rule already grants a same-user process.
//
// Data path: CopyExecutor (inline or sliced over the engine's workers, chunks of at most
// kCopyChunkBytes / kCopyChunkSpans, stop_reason() between chunks, CopyGuard held while
// copying), with a ChunkCopier that turns each chunk into process_vm_writev/readv calls of up
// to IOV_MAX iovecs. A peer that exits mid-copy (ESRCH) ends the batch with PeerDisconnected.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace kvferry {

Result<std::unique_ptr<Transport>> make_cma_transport(const TransportEnv& env);

}  // namespace kvferry
