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
// Limits (Options::limits): a connection over max_connections or max_connections_per_source
// is closed as soon as it is accepted. With Options::evict_idle, a listener at a limit first
// makes room instead: it closes the oldest connection that has not finished its opening
// exchange (its owner has not called ConnectionSlot::mark_engaged) from the source that holds
// the most connections, or from the new connection's own source when that source is at its
// share. So a flood of connections that never send a request cannot keep out a peer that
// sends its request at once, and one source cannot take the places of the others.
//
// Thread-safety: bind/start/stop/destructor from the owner's thread; backoffs(), refused(),
// evicted() and open_connections() from any.
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
#include "core/log_throttle.h"
#include "core/net.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"

namespace kvferry {

struct ConnectionCounts;
struct SlotState;

// One accepted connection's place against its listener's limits; destroying (or
// release()-ing) it frees the place. Empty (default-constructed) slots count nothing.
// Thread-safety: one owner; the acceptor may evict the connection from its own thread.
class ConnectionSlot {
 public:
  ConnectionSlot() = default;
  ConnectionSlot(std::shared_ptr<ConnectionCounts> counts, std::shared_ptr<SlotState> state);
  ConnectionSlot(ConnectionSlot&& other) noexcept = default;
  ConnectionSlot& operator=(ConnectionSlot&& other) noexcept;
  ConnectionSlot(const ConnectionSlot&) = delete;
  ConnectionSlot& operator=(const ConnectionSlot&) = delete;
  ~ConnectionSlot();

  void release();
  // The connection finished its opening exchange: the acceptor no longer closes it to make
  // room for others. False when it was evicted already (its socket is shut down).
  bool mark_engaged();
  // Whether the acceptor closed the connection to make room (its socket is shut down).
  bool evicted() const;
  // The client's address (IP literal), "" when unknown.
  const std::string& source() const;

 private:
  std::shared_ptr<ConnectionCounts> counts_;
  std::shared_ptr<SlotState> state_;
};

// How long the accept thread pauses after accept failed for lack of resources.
inline constexpr std::chrono::milliseconds kAcceptBackoff{50};

class Acceptor {
 public:
  using OnConnection = std::function<void(Fd connection, ConnectionSlot slot)>;
  // The accept call: a new descriptor, or -1 with errno set. Tests inject failures here.
  using AcceptCall = std::function<int(int listen_fd, int flags)>;

  struct Options {
    std::string name = "listener";  // in log messages: "handshake", "tcp", "pd control"
    int flags = 0;                  // accept4 flags besides SOCK_CLOEXEC (SOCK_NONBLOCK)
    std::chrono::milliseconds backoff = kAcceptBackoff;
    AcceptCall accept_call;  // empty = ::accept4
    // Only max_connections and max_connections_per_source are the acceptor's business.
    ListenerLimits limits;
    // At a limit, close the oldest connection not yet engaged to admit the new one (see
    // above) rather than the new one. For listeners whose owner calls mark_engaged.
    bool evict_idle = false;

    static Options named(std::string name, int flags = 0,
                         const ListenerLimits& limits = ListenerLimits{}) {
      Options options;
      options.name = std::move(name);
      options.flags = flags;
      options.limits = limits;
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
  // How many connections were closed at once for being over a limit.
  uint64_t refused() const { return refused_.load(); }
  // How many connections not yet engaged were closed to make room for new ones.
  uint64_t evicted() const { return evicted_.load(); }
  // Connections holding a slot now.
  uint32_t open_connections() const;

 private:
  Acceptor(Fd listener, Fd wake, Endpoint bound, Options options);
  void accept_loop();
  // Sleeps for the back-off; false when stop() was called meanwhile.
  bool back_off(int error);
  // A slot for the connection `fd` from `source`, or false when over a limit and no room
  // could be made.
  bool take_slot(int fd, const std::string& source, ConnectionSlot& slot);
  // With evict_idle: the connection to close so that one from `source` fits; null when none
  // may be. Called with counts_->mu held.
  SlotState* choose_victim_locked(const std::string& source, bool over_source) const;
  // Shuts the victim's socket down and frees its place at once. counts_->mu held.
  void evict_locked(SlotState& victim, const std::string& admitting);

  Fd listener_;
  Fd wake_;  // eventfd: readable once stop() was called
  Endpoint bound_;
  Options options_;
  OnConnection on_connection_;
  std::atomic<uint64_t> backoffs_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> evicted_{0};
  std::shared_ptr<ConnectionCounts> counts_;
  bool backing_off_ = false;  // accept thread only: logged the current episode
  LogThrottle refusals_log_;  // a flood refuses or evicts thousands a second
  LogThrottle evictions_log_;
  std::thread thread_;
};

}  // namespace kvferry
