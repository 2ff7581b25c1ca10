// NotificationReceiver: the target side of engine notifications. It listens on its own
// port (advertised as the descriptor's notify_endpoint), serves each sender's connection on
// a thread of its own (notify_wire.h has the frames), and keeps what arrives in an inbox
// that TransferEngine::get_notifications drains.
//
// Guarantees: a notification is acknowledged only once it is in the inbox, so a sender that
// saw the ack knows it will be drained; the inbox keeps each connection's notifications in
// arrival order; a connection that ends without the sender's kBye (the sender died or the
// network broke) leaves a kSenderLost entry naming it, after its last notification. The
// inbox is bounded: when it holds max_pending entries a connection stops reading (and
// acking) until the owner drains, so a sender that outpaces the owner sees its
// notifications time out rather than this process grow without bound.
//
// Thread-safety: drain() may be called from any thread, concurrently with deliveries.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/acceptor.h"
#include "core/fd.h"
#include "core/net.h"
#include "engine/notify_wire.h"
#include "kvferry/listener_limits.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::detail {

class NotificationReceiver {
 public:
  struct Options {
    Endpoint listen;
    uint64_t incarnation = 0;
    std::optional<std::string> secret;  // set: every sender must prove it
    uint32_t max_notification_bytes = kDefaultMaxNotificationBytes;
    size_t max_pending = kDefaultMaxPendingNotifications;
    std::chrono::milliseconds io_timeout{5000};  // the setup of a connection, one frame
    // Connections at once, in total and per source (the acceptor closes the rest): one per
    // sending peer incarnation, each with its own thread.
    ListenerLimits limits{.max_connections = 1024, .max_connections_per_source = 64};
  };

  static Result<std::unique_ptr<NotificationReceiver>> start(Options options);
  ~NotificationReceiver();
  NotificationReceiver(const NotificationReceiver&) = delete;
  NotificationReceiver& operator=(const NotificationReceiver&) = delete;

  const Endpoint& endpoint() const { return acceptor_->endpoint(); }
  // Takes at most `max` entries, oldest first; never blocks on the network.
  std::vector<Notification> drain(size_t max);

 private:
  struct Connection {
    Fd fd;
    ConnectionSlot slot;  // its place against options_.limits, freed with it
    std::thread thread;
    std::atomic<bool> finished{false};
  };
  NotificationReceiver(std::unique_ptr<Acceptor> acceptor, Options options);
  void accept(Fd connection, ConnectionSlot slot);
  void serve(Connection& c);
  // The sender's hello, the challenge and proof; the sender's identity once welcomed.
  Result<NotifyHello> admit(int fd);
  // False when stopping.
  bool push(Notification n);

  std::unique_ptr<Acceptor> acceptor_;
  const Options options_;
  std::atomic<bool> stopping_{false};

  std::mutex connections_mu_;
  std::list<Connection> connections_;  // guarded by connections_mu_

  std::mutex inbox_mu_;
  std::condition_variable inbox_room_;
  std::deque<Notification> inbox_;  // guarded by inbox_mu_
};

}  // namespace kvferry::detail
