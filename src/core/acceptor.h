// Acceptor: a listening TCP socket and the thread that accepts connections on it, for every
// kvferry listener (the p2p handshake server, the tcp data server, the PD control listener).
//
// bind() listens at once, so the owner learns the real port before anything is accepted;
// start() starts the accept thread, which hands each new connection to the callback on that
// thread (the callback should only queue or adopt it). stop() (or the destructor) wakes the
// thread through an eventfd and joins it; after it returns the callback never runs again.
//
// When accept fails for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) or for any reason
// that is not about one connection, the thread backs off for `backoff` before trying again:
// a pending connection keeps the listener readable, so retrying at once would spin at 100%
// CPU until a descriptor frees up. Errors about one connection (ECONNABORTED, EPROTO, ...)
// are retried at once.
//
// Thread-safety: bind/start/stop/destructor from the owner's thread; backoffs() from any.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/status.h"

namespace kvferry {

// How long the accept thread pauses after accept failed for lack of resources.
inline constexpr std::chrono::milliseconds kAcceptBackoff{50};

class Acceptor {
 public:
  using OnConnection = std::function<void(Fd connection)>;
  // The accept call: a new descriptor, or -1 with errno set. Tests inject failures here.
  using AcceptCall = std::function<int(int listen_fd, int flags)>;

  struct Options {
    std::string name = "listener";  // in log messages: "handshake", "tcp", "pd control"
    int flags = 0;                  // accept4 flags besides SOCK_CLOEXEC (SOCK_NONBLOCK)
    std::chrono::milliseconds backoff = kAcceptBackoff;
    AcceptCall accept_call;  // empty = ::accept4

    static Options named(std::string name, int flags = 0) {
      Options options;
      options.name = std::move(name);
      options.flags = flags;
      return options;
    }
  };

  // Listens on `endpoint` (port 0 picks one). Internal when the socket cannot be bound.
  static Result<std::unique_ptr<Acceptor>> bind(const Endpoint& endpoint, Options options);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Starts the accept thread. Call once.
  void start(OnConnection on_connection);
  // Stops accepting and joins the thread; idempotent.
  void stop();

  const Endpoint& endpoint() const { return bound_; }
  // How many times the thread has backed off so far.
  uint64_t backoffs() const { return backoffs_.load(); }

 private:
  Acceptor(Fd listener, Fd wake, Endpoint bound, Options options);
  void accept_loop();
  // Sleeps for the back-off; false when stop() was called meanwhile.
  bool back_off(int error);

  Fd listener_;
  Fd wake_;  // eventfd: readable once stop() was called
  Endpoint bound_;
  Options options_;
  OnConnection on_connection_;
  std::atomic<uint64_t> backoffs_{0};
  bool backing_off_ = false;  // accept thread only: logged the current episode
  std::thread thread_;
};

}  // namespace kvferry
