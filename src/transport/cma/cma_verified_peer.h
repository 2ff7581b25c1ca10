// The initiator's side of a cma session (transport/cma/cma_session.h): the target's pid and
// pidfd as the kernel named them, and the ranges the target declared over the session, kept
// up to date from its Add and Revoke frames. The cma copier copies only inside them.
//
// Thread-safety: every method may be called from any thread; copy_within runs copies
// concurrently, and drain (the hub's thread, or a copy that missed) excludes them.
#pragma once

#include <pthread.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "core/fd.h"
#include "kvferry/status.h"
#include "transport/cma/cma_session_wire.h"
#include "transport/peer_liveness.h"

namespace kvferry {

// A writer-preferring reader-writer lock (glibc's default prefers readers, and copies on
// several threads would then keep a Revoke waiting for as long as they keep coming).
class WriterPreferringLock {
 public:
  WriterPreferringLock();
  ~WriterPreferringLock();
  WriterPreferringLock(const WriterPreferringLock&) = delete;
  WriterPreferringLock& operator=(const WriterPreferringLock&) = delete;
  void lock() { ::pthread_rwlock_wrlock(&lock_); }
  void unlock() { ::pthread_rwlock_unlock(&lock_); }
  void lock_shared() { ::pthread_rwlock_rdlock(&lock_); }
  void unlock_shared() { ::pthread_rwlock_unlock(&lock_); }

 private:
  pthread_rwlock_t lock_{};
};

// The initiator's side of one session: the target's verified pid and pidfd, and the ranges
// it declared.
class CmaVerifiedPeer {
 public:
  // `liveness` (may be null): the engine's view of the peer, marked disconnected when the
  // session closes, so that the peer is opened afresh instead of failing every cma copy.
  CmaVerifiedPeer(Fd connection, pid_t pid, Fd pidfd, std::string peer_name,
                  const std::vector<CmaRange>& declared,
                  std::shared_ptr<PeerLiveness> liveness = {});
  pid_t pid() const { return pid_; }
  // The verified pidfd (owned here); invalid where the kernel has none.
  int pidfd() const { return pidfd_.get(); }
  const std::string& peer_name() const { return peer_name_; }

  // Runs `copy` while every range in `remote` lies inside the declared set, which stays as
  // it is until `copy` returns (a Revoke waits). Frames that arrived are applied first when
  // a range is not covered (a registration the descriptor already shows may not have been
  // read yet). NotRegistered naming the range when it is still not covered, PeerDisconnected
  // once the session has closed.
  template <typename Copy>
  Status copy_within(std::span<const iovec> remote, Copy&& copy) {
    {
      std::shared_lock lock(lock_);
      Status admitted = admit_locked(remote);
      if (admitted.ok()) return copy();
      if (admitted.code() != StatusCode::kNotRegistered) return admitted;
    }
    drain();
    std::shared_lock lock(lock_);
    KVF_RETURN_IF_ERROR(admit_locked(remote));
    return copy();
  }

  // Reads and applies what the target sent (Add, Revoke: acknowledged once applied), without
  // blocking. Called by the hub when the connection is readable.
  void drain();
  // Shuts the connection down: every later copy fails. `tell_peer`: mark the peer's liveness
  // disconnected too (not when the link is being refused at open).
  void close(const std::string& why, bool tell_peer = true);
  bool closed() const;
  int fd() const { return connection_.get(); }
  // Whether [addr, addr + length) lies inside the declared set (tests).
  bool declares(uint64_t addr, uint64_t length) const;
  // The first declared range, to probe the kernel's permission with.
  std::optional<uint64_t> first_address() const;

 private:
  Status admit_locked(std::span<const iovec> remote) const;
  bool covered_locked(uint64_t addr, uint64_t length) const;
  void close_locked(const std::string& why, bool tell_peer = true);
  // Applies the whole frames in inbox_ (Add, Revoke with its Ack) and drops them.
  void apply_frames_locked();

  Fd connection_;
  const pid_t pid_;
  Fd pidfd_;
  const std::string peer_name_;
  const std::shared_ptr<PeerLiveness> liveness_;
  mutable WriterPreferringLock lock_;
  std::map<uint64_t, uint64_t> declared_;  // addr -> length; guarded by lock_
  std::vector<std::byte> inbox_;           // a frame received in part; guarded by lock_
  std::string closed_why_;                 // non-empty once closed; guarded by lock_
};

}  // namespace kvferry
