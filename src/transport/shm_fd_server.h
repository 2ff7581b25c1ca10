// Passing shared-memory file descriptors to same-host peers (docs/PROTOCOL.md, "shm
// descriptor passing").
//
// A peer maps an engine's allocate_shared memory through the memfd itself, which it gets from
// the engine over a Unix socket (SCM_RIGHTS), not through /proc/<pid>/fd of the engine: the
// engine decides who may map its memory, and it works where the peer's /proc is hidden.
//
//   ShmFdServer   listens on an abstract Unix socket ("\0kvferry-shm/<pid>/<incarnation>",
//                 named in the segment descriptor as `shm_socket`), and hands out the memfd
//                 of one allocation per connection, by inode.
//   fetch_shm_fd  the peer's side.
//
// Who gets a descriptor: with a secret, a peer that proves it (the challenge-response of
// core/auth.h); without one, a process of the same user (or root), as SO_PEERCRED reports it —
// what /proc/<pid>/fd allowed before, and what the kernel lets such a process do anyway
// (ptrace). Any other peer gets Unauthenticated, and its engine takes the next route.
//
// Abstract sockets belong to a network namespace: a peer in another one cannot connect
// (fetch_shm_fd: NotSupported), and takes the next route too.
//
// Bounds: at most kMaxConnections connections at once (the next is closed at accept: the
// process's accept thread takes them, core/acceptor.h), each with io_timeout from accept to
// its reply, served by up to kThreads threads (started as requests come: an engine no peer
// asks runs none). A local crowd of slow clients can delay a
// peer's fetch past its own timeout; that peer then takes the next route (cma, tcp), so its
// transfers still go — only the shm route is lost while the crowd lasts.
//
// Thread-safety: ShmFdServer serves on its own threads; the lookup callback is called on them.
// fetch_shm_fd is a free function.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/acceptor.h"
#include "core/fd.h"
#include "core/net.h"
#include "core/thread_pool.h"
#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint32_t kShmFdMagic = 0x5346564B;  // "KVFS" as little-endian bytes
inline constexpr uint16_t kShmFdVersion = 1;
enum class ShmFdFrame : uint16_t {
  kChallenge = 1,  // server -> client: 32-byte nonce, or empty without a secret
  kRequest = 2,    // client -> server: [32-byte proof when challenged] + u64 inode
  kReply = 3,      // server -> client: u8 StatusCode + message; the memfd attached when OK
};

class ShmFdServer {
 public:
  // A duplicate of the memfd with this inode, or an invalid Fd when there is none.
  using Lookup = std::function<Fd(uint64_t inode)>;

  static Result<std::unique_ptr<ShmFdServer>> start(uint64_t incarnation, Lookup lookup,
                                                    std::optional<std::string> secret,
                                                    std::chrono::milliseconds io_timeout);
  ~ShmFdServer();
  ShmFdServer(const ShmFdServer&) = delete;
  ShmFdServer& operator=(const ShmFdServer&) = delete;

  // The abstract socket name, without its leading NUL (as the descriptor carries it).
  const std::string& name() const { return name_; }

 private:
  static constexpr uint32_t kMaxConnections = 64;
  static constexpr int kThreads = 4;

  ShmFdServer(std::unique_ptr<Acceptor> acceptor, std::string name, Lookup lookup,
              std::optional<std::string> secret, std::chrono::milliseconds io_timeout);
  void serve(Fd connection, Clock::time_point deadline);

  std::string name_;
  Lookup lookup_;
  std::optional<std::string> secret_;
  std::chrono::milliseconds io_timeout_;
  ThreadPool pool_;
  // Declared last: stopped first, so no connection is handed to a pool being torn down.
  std::unique_ptr<Acceptor> acceptor_;
};

// Asks the engine listening on abstract socket `name`, which must be process `expected_pid`
// as SO_PEERCRED reports it, for the memfd with `inode`, proving `secret` when asked.
// Unauthenticated when the listener is another process, when the engine refuses this
// process (no or another secret, another user), or when it sends no challenge while this
// side holds a secret; NotSupported when the socket cannot be reached (another network
// namespace, or the engine is gone), PeerDisconnected when it has no such memfd (freed),
// ProtocolError for a malformed answer.
Result<Fd> fetch_shm_fd(const std::string& name, int64_t expected_pid, uint64_t inode,
                        const std::optional<std::string>& secret, Clock::time_point deadline);

}  // namespace kvferry
