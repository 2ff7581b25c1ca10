// Verified identity and a fenced region set for cma (docs/PROTOCOL.md, "cma sessions").
//
// process_vm_writev addresses a process by pid, and the kernel checks only that *this*
// process may attach to that pid. A pid taken from a peer's descriptor is therefore a
// confused deputy: a forged descriptor (a fake handshake server, a record put in the store)
// names any process and any address, and a root engine would write there. So cma never
// uses the descriptor's pid or regions. It uses what the target's engine says over a
// channel the kernel vouches for:
//
//   * the target's engine listens on an abstract Unix socket ("\0kvferry-cma/<pid>/<inc>",
//     SegmentDescriptor::cma_socket). The initiator connects and asks the kernel who listens
//     there (SO_PEERCRED, and SO_PEERPIDFD for a pidfd of that very process where the kernel
//     has it). A descriptor whose pid differs is refused (Unauthenticated, naming both pids);
//   * over that connection the target declares its incarnation (checked against the
//     descriptor's) and its host regions; later registrations follow as Add frames, and
//     unregistrations as Revoke frames that the initiator acknowledges;
//   * the initiator copies only into (or out of) ranges inside the declared set, holding the
//     set steady while the copy runs. A Revoke waits for copies in flight, removes the
//     ranges, and is acknowledged only then.
//
// Unregistering fences cma: CmaSessionHub::revoke returns once every session the region was
// declared to has acknowledged (no copy into it can start afterwards), has closed (a dead
// peer counts as acknowledged), or was cut off after `io_timeout` (its connection is shut
// down; the initiator sees that and fails every later copy: PeerDisconnected).
//
// Who may open a session: with a secret, a peer that proves it (core/auth.h); without one,
// a process of the same user or root, as SO_PEERCRED reports it (the kernel would refuse
// cross-memory attach to anyone else anyway). An initiator that holds a secret refuses a
// session that came without a challenge.
//
// Residual window: the pid is named by the kernel, but the listener's process may exit and
// its pid be reused between connect() and the pidfd (only where the kernel has no
// SO_PEERPIDFD); the copier's pidfd check then fails every copy once it notices the exit.
//
// Threads: one per hub. It accepts and serves target-side connections (bounded: at most
// kMaxPendingOpens unauthenticated ones, each for io_timeout) and reads the Add and Revoke
// frames of every initiator-side session.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <pthread.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint32_t kCmaSessionMagic = 0x4346564B;  // "KVFC" as little-endian bytes
inline constexpr uint16_t kCmaSessionVersion = 1;
enum class CmaSessionFrame : uint16_t {
  kChallenge = 1,  // target -> initiator: 32-byte nonce, or empty without a secret
  kOpen = 2,       // initiator -> target: [32-byte proof when challenged]
  kDeclare = 3,    // target -> initiator: u8 StatusCode; OK: u64 incarnation + ranges; else text
  kAdd = 4,        // target -> initiator: ranges now registered
  kRevoke = 5,     // target -> initiator: u64 sequence + ranges no longer registered
  kAck = 6,        // initiator -> target: u64 sequence of the Revoke it applied
};
// Ranges on the wire: u32 count, then count x (u64 addr, u64 length).
inline constexpr uint32_t kMaxCmaFrameBytes = 2u << 20;

struct CmaRange {
  uint64_t addr = 0;
  uint64_t length = 0;
};

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
  pthread_rwlock_t lock_;
};

// The initiator's side of one session: the target's verified pid and pidfd, and the ranges
// it declared.
class CmaVerifiedPeer {
 public:
  CmaVerifiedPeer(Fd connection, pid_t pid, Fd pidfd, std::string peer_name,
                  std::vector<CmaRange> declared);
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
  // Shuts the connection down: every later copy fails.
  void close(const std::string& why);
  bool closed() const;
  int fd() const { return connection_.get(); }
  // Whether [addr, addr + length) lies inside the declared set (tests).
  bool declares(uint64_t addr, uint64_t length) const;
  // The first declared range, to probe the kernel's permission with.
  std::optional<uint64_t> first_address() const;

 private:
  Status admit_locked(std::span<const iovec> remote) const;
  bool covered_locked(uint64_t addr, uint64_t length) const;
  void close_locked(const std::string& why);

  Fd connection_;
  const pid_t pid_;
  Fd pidfd_;
  const std::string peer_name_;
  mutable WriterPreferringLock lock_;
  std::map<uint64_t, uint64_t> declared_;  // addr -> length; guarded by lock_
  std::vector<std::byte> inbox_;           // a frame received in part; guarded by lock_
  std::string closed_why_;                 // non-empty once closed; guarded by lock_
};

class CmaSessionHub {
 public:
  struct Options {
    uint64_t incarnation = 0;
    std::optional<std::string> secret;
    std::chrono::milliseconds io_timeout{2000};  // a pending open; a Declare; a Revoke's acks
  };
  // Listens on "\0kvferry-cma/<pid>/<incarnation>" and starts the hub's thread.
  static Result<std::unique_ptr<CmaSessionHub>> start(Options options);
  ~CmaSessionHub();
  CmaSessionHub(const CmaSessionHub&) = delete;
  CmaSessionHub& operator=(const CmaSessionHub&) = delete;

  // The abstract socket name, without its leading NUL (as the descriptor carries it).
  const std::string& name() const { return name_; }

  // Target side. Ranges this engine registers (host memory) and unregisters. revoke returns
  // once no session can copy into them any more (see above); the number of sessions cut off.
  void declare(CmaRange range);
  size_t revoke(std::span<const CmaRange> ranges);
  // Sessions open on the target side (tests).
  size_t sessions() const;

  // Initiator side: opens a session to the engine on `socket_name`, which the descriptor
  // says is pid `claimed_pid`, incarnation `claimed_incarnation`. Unauthenticated when the
  // kernel names another pid, the engine another incarnation, or a challenge is missing
  // while this engine holds a secret (or present while it holds none); PeerUnreachable when
  // nothing listens there.
  Result<std::shared_ptr<CmaVerifiedPeer>> open(const std::string& socket_name,
                                                const std::string& peer_name, int64_t claimed_pid,
                                                uint64_t claimed_incarnation);
  // Closes the initiator-side sessions opened to this incarnation (the peer is gone).
  void forget(uint64_t incarnation);

 private:
  struct Connection;
  static constexpr size_t kMaxPendingOpens = 64;
  static constexpr size_t kMaxConnections = 1024;

  CmaSessionHub(Fd listener, Fd wake, std::string name, Options options);
  void loop();
  void wake() const;
  void accept_ready();
  void read_connection(const std::shared_ptr<Connection>& c);
  void finish_open(const std::shared_ptr<Connection>& c);
  void erase_closed();

  Fd listener_;
  Fd wake_;  // eventfd: the poll set changed, or the hub stops
  std::string name_;
  Options options_;

  mutable std::mutex mu_;
  std::condition_variable acked_;
  std::map<uint64_t, uint64_t> declared_;             // guarded by mu_
  std::vector<std::shared_ptr<Connection>> targets_;  // target side; guarded by mu_
  uint64_t revoke_sequence_ = 0;                      // guarded by mu_
  // Initiator side, with the incarnation they were opened for; guarded by mu_.
  std::vector<std::pair<uint64_t, std::shared_ptr<CmaVerifiedPeer>>> initiators_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kvferry
