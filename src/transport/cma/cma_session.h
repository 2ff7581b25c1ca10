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

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/status.h"
#include "transport/cma/cma_session_wire.h"
#include "transport/cma/cma_verified_peer.h"

namespace kvferry {

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
                                                uint64_t claimed_incarnation,
                                                std::shared_ptr<PeerLiveness> liveness = {});
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

  std::mutex revoke_mu_;  // held through a whole revoke
  mutable std::mutex mu_;
  std::condition_variable acked_;
  std::map<uint64_t, uint64_t> declared_;             // guarded by mu_
  std::vector<std::shared_ptr<Connection>> targets_;  // target side; guarded by mu_
  uint64_t revoke_sequence_ = 0;                      // guarded by mu_
  // Initiator side, with the incarnation they were opened for; guarded by mu_.
  std::vector<std::pair<uint64_t, std::shared_ptr<CmaVerifiedPeer>>> initiators_;
  Clock::time_point accept_paused_until_{};  // hub thread only
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace kvferry
