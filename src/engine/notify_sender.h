// NotificationSender: the sending side of engine notifications to one peer incarnation.
// One thread per sender takes queued notifications in order, connects on first need (the
// hello names the peer incarnation it expects, so a restarted peer refuses it), proves the
// shared secret when the peer asks, sends each notification and waits for its ack before
// the next: the peer receives them in the order they were queued. Closing the sender (the
// peer closed, the engine shut down) still delivers what was queued, within kDrain.
//
// Each notification has a NotifyTicket that ends OK once the peer acknowledged it (it is in
// the peer's inbox), or with the error: PeerDisconnected (the connection broke, or the peer
// died or restarted), PeerUnreachable, Unauthenticated, InvalidArgument (larger than the
// peer accepts), Timeout (no ack by the deadline) or Cancelled (this engine shut down).
// A notification whose outcome was an error may or may not have arrived.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/status.h"
#include "transport/peer_liveness.h"

namespace kvferry::detail {

// The outcome of one notification; set once.
class NotifyTicket {
 public:
  void finish(Status outcome);
  // The outcome, or nullopt while the notification is on its way.
  std::optional<Status> poll() const;
  // Waits until the outcome is known or `until`; nullopt when still pending.
  std::optional<Status> wait_until(Clock::time_point until) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::optional<Status> outcome_;  // guarded by mu_
};

class NotificationSender {
 public:
  struct Identity {
    std::string name;      // EngineOptions::name
    std::string endpoint;  // the handshake endpoint
    uint64_t incarnation = 0;
    std::optional<std::string> secret;
  };

  // A sender with its thread running; Internal when the thread cannot start.
  static Result<std::shared_ptr<NotificationSender>> start(std::string peer_name, Endpoint target,
                                                           uint64_t target_incarnation,
                                                           Identity self,
                                                           std::shared_ptr<PeerLiveness> liveness);
  ~NotificationSender();  // drains (shutdown), fails the rest with Cancelled, says kBye, joins
  NotificationSender(const NotificationSender&) = delete;
  NotificationSender& operator=(const NotificationSender&) = delete;

  uint64_t target_incarnation() const { return target_incarnation_; }
  // Queues `bytes`; the ticket ends by `deadline` at the latest.
  void enqueue(std::string bytes, Clock::time_point deadline, std::shared_ptr<NotifyTicket> ticket);
  // Fails every later notification with `why`. Those already queued are still delivered,
  // in order, each by its own deadline and all within `drain` of now (a queued notification
  // may be all its batch waited for: NotificationCompletion::kQueued); what is left then
  // fails with `why`, and the connection closes. The destructor drains for kDrain.
  void shutdown(const Status& why, Clock::duration drain = Clock::duration::zero());

  static constexpr std::chrono::seconds kDrain{2};

 private:
  NotificationSender(std::string peer_name, Endpoint target, uint64_t target_incarnation,
                     Identity self, std::shared_ptr<PeerLiveness> liveness);
  struct Item {
    std::string bytes;
    Clock::time_point deadline;
    std::shared_ptr<NotifyTicket> ticket;
  };
  void run();
  Status deliver(const Item& item);
  Status connect(Clock::time_point deadline);
  // A failure of the peer as the caller sees it: why the peer is gone, if it is.
  Status peer_error(const Status& s) const;
  // Whether the peer is known gone and nothing is being drained.
  bool peer_gone();

  const std::string peer_name_;
  const Endpoint target_;
  const uint64_t target_incarnation_;
  const Identity self_;
  const std::shared_ptr<PeerLiveness> liveness_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;         // guarded by mu_
  std::optional<Status> closed_;   // guarded by mu_: set by shutdown or the destructor
  Clock::time_point drain_until_;  // guarded by mu_: with closed_, when the queue is given up

  // The thread's own.
  Fd connection_;
  uint32_t peer_max_bytes_ = 0;
  uint64_t next_sequence_ = 1;

  std::thread thread_;  // started by start(), once the rest is built
};

}  // namespace kvferry::detail
