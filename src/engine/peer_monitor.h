// PeerMonitor: notices on its own when a same-host peer process dies, through a pidfd
// per peer (readable once the process exits), and marks the peer disconnected so its
// batches stop and later submissions fail with PeerDisconnected. Where the kernel has no
// pidfd_open (before 5.3) or a seccomp profile refuses it (EPERM, as older container
// runtimes' profiles do for calls they do not know), nothing is watched: a peer's death is
// then seen through its connections, and the engine says so once.
//
// Thread-safety: watch() may be called from any thread; one monitor thread runs epoll,
// started with the first watch (an engine with no same-host peer runs none).
#pragma once

#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/fd.h"
#include "engine/peer_state.h"

namespace kvferry::detail {

class PeerMonitor {
 public:
  PeerMonitor();
  ~PeerMonitor();
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  // Starts watching the peer's process (OK without a watch where pidfd_open is refused).
  // Internal if pidfd_open fails otherwise or the monitor thread cannot start;
  // PeerDisconnected if the process is already gone.
  Status watch(const std::shared_ptr<PeerState>& peer);

 private:
  void loop();

  Fd epoll_;
  Fd wake_;
  std::mutex mu_;
  uint64_t next_key_ = 1;
  struct Watched {
    Fd pidfd;
    std::weak_ptr<PeerState> peer;
  };
  std::unordered_map<uint64_t, Watched> watched_;  // guarded by mu_
  std::thread thread_;                             // started under mu_
  bool said_unwatched_ = false;                    // guarded by mu_
};

}  // namespace kvferry::detail
