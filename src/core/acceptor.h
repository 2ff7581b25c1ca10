// Acceptor: a listening TCP socket and how connections on it are accepted, for every
// kvferry listener (the p2p handshake server, the tcp data server, the notification
// listener, the PD control listener).
//
// bind() listens at once, so the owner learns the real port before anything is accepted;
// start() hands the listener to the process's accept thread (one for every listener of the
// process: "kvf-accept"), which hands each new connection to the callback on that thread (the
// callback must only queue or adopt it: it holds up every listener while it runs). stop()
// (or the destructor) takes the listener back; after it returns the callback never runs
// again. The thread starts with the first listener started and ends when the last stops.
//
// When accept fails for lack of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM) or for any reason
// that is not about one connection, the listener is left out of the thread's poll for
// `backoff` before it tries again: a pending connection keeps the listener readable, so
// retrying at once would spin at 100% CPU until a descriptor frees up. Errors about one
// connection (ECONNABORTED, EPROTO, ...) are retried at once.
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
#include <optional>
#include <string>
#include <utility>

#include "core/fd.h"
#include "core/log_throttle.h"
#include "core/net.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"

namespace kvferry {

struct ConnectionCounts;
class AcceptHub;
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

// How long a listener is left alone after accept failed for lack of resources.
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
  // Accepts on a socket already listening (a Unix one: the client's source is then ""), named
  // `where` in log messages; endpoint() is empty.
  static Result<std::unique_ptr<Acceptor>> adopt(Fd listener, std::string where, Options options);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Starts accepting (on the process's accept thread). Call once. Internal when the accept
  // thread is not running and cannot start.
  Status start(OnConnection on_connection);
  // Stops accepting; idempotent. The callback does not run after it returns.
  void stop();

  const Endpoint& endpoint() const { return bound_; }
  // How many times the listener has backed off so far.
  uint64_t backoffs() const { return backoffs_.load(); }
  // How many connections were closed at once for being over a limit.
  uint64_t refused() const { return refused_.load(); }
  // How many connections not yet engaged were closed to make room for new ones.
  uint64_t evicted() const { return evicted_.load(); }
  // Connections holding a slot now.
  uint32_t open_connections() const;

 private:
  friend class AcceptHub;
  using Clock = std::chrono::steady_clock;
  Acceptor(Fd listener, Endpoint bound, std::string where, Options options);
  static Result<std::unique_ptr<Acceptor>> adopt_as(Fd listener, Endpoint bound, std::string where,
                                                    Options options);
  // The listener is readable: accepts what is queued (a burst at most). Returns when to try
  // again if accept failed for lack of resources (the back-off), else nothing.
  std::optional<Clock::time_point> accept_ready();
  // Counts and logs a back-off; returns its end.
  Clock::time_point back_off(int error);
  // A slot for the connection `fd` from `source`, or false when over a limit and no room
  // could be made.
  bool take_slot(int fd, const std::string& source, ConnectionSlot& slot);
  // With evict_idle: the connection to close so that one from `source` fits; null when none
  // may be. Called with counts_->mu held.
  SlotState* choose_victim_locked(const std::string& source, bool over_source) const;
  // Shuts the victim's socket down and frees its place at once. counts_->mu held.
  void evict_locked(SlotState& victim, const std::string& admitting);

  Fd listener_;
  Endpoint bound_;
  std::string where_;  // in log messages: the endpoint, or adopt's name
  Options options_;
  OnConnection on_connection_;
  std::atomic<bool> stopped_{false};
  std::atomic<uint64_t> backoffs_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> evicted_{0};
  std::shared_ptr<ConnectionCounts> counts_;
  bool backing_off_ = false;  // accept thread only: logged the current episode
  LogThrottle refusals_log_;  // a flood refuses or evicts thousands a second
  LogThrottle evictions_log_;
};

}  // namespace kvferry
