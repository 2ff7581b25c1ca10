// NotificationReceiver: the target side of engine notifications. It listens on its own
// port (advertised as the descriptor's notify_endpoint), serves every sender's connection
// on one epoll thread (notify_wire.h has the frames), and keeps what arrives in a NotifyInbox
// that TransferEngine::get_notifications drains.
//
// Guarantees: a notification is acknowledged only once it is in the inbox, so a sender that
// saw the ack knows it will be drained; the inbox keeps each connection's notifications in
// arrival order; a connection that ends without the sender's kBye (the sender died or the
// network broke) leaves a kSenderLost entry naming it, after its last notification — if the
// sender had proved the secret or delivered at least one notification on it. A connection
// that did neither (anyone can connect and say hello) leaves nothing: otherwise a stream of
// connect-hello-close would fill the inbox with the entries of senders that never existed.
// A lost entry's room is reserved when the connection first delivers (or proves), so it is
// never refused for lack of room.
//
// Bounds: the inbox holds at most max_pending entries and max_pending_bytes bytes, and one
// sender at most its share of either (notify_inbox.h). A notification that does not fit is
// neither acknowledged nor dropped: its connection is not read until the owner drains enough,
// so a sender that outpaces the owner sees its notifications time out while every other
// sender's still get in. Each connection holds one frame at a time, in a buffer that grows
// with the bytes received up to the largest frame its state allows (the hello before the
// welcome: kMaxNotifyHelloBytes), and the acks it has not taken (up to a few KiB; then it is
// not read). Before its welcome a connection has io_timeout in all; after, each frame must
// arrive whole within io_timeout of its first byte, and queued acks must move within
// io_timeout; an idle connection stays open. Held back and dropped notifications are counted
// (EngineMetrics) and logged at most once per interval.
//
// Thread-safety: drain() and stats() may be called from any thread, concurrently with
// deliveries; start and the destructor from the owner's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/acceptor.h"
#include "core/net.h"
#include "engine/notify_wire.h"
#include "kvferry/defaults.h"
#include "kvferry/listener_limits.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::detail {

class EngineMetrics;

class NotificationReceiver {
 public:
  struct Options {
    Endpoint listen;
    uint64_t incarnation = 0;
    std::optional<std::string> secret;  // set: every sender must prove it
    uint32_t max_notification_bytes = kDefaultMaxNotificationBytes;
    size_t max_pending = kDefaultMaxPendingNotifications;
    size_t max_pending_bytes = kDefaultMaxPendingNotificationBytes;
    std::chrono::milliseconds io_timeout{5000};  // the setup of a connection, one frame
    // Connections at once, in total and per source (the acceptor closes the rest): one per
    // sending peer incarnation, each a few hundred bytes when idle.
    ListenerLimits limits{.max_connections = 1024, .max_connections_per_source = 64};
    EngineMetrics* metrics = nullptr;  // not owned; outlives the receiver; null: not counted
  };

  // What the receiver holds now, and what it has counted.
  struct Stats {
    size_t connections = 0;    // open, served by the loop
    size_t waiting = 0;        // connections not read until there is room in the inbox
    size_t inbox_entries = 0;  // entries and lost-entry reservations
    size_t inbox_bytes = 0;
    size_t buffered_bytes = 0;  // the connections' buffers (capacity)
    uint64_t welcomed = 0;      // connections that finished their setup
    uint64_t held_back = 0;     // notifications that had to wait for room
    uint64_t dropped = 0;       // NotifyDrop, any kind
  };

  static Result<std::unique_ptr<NotificationReceiver>> start(Options options);
  ~NotificationReceiver();
  NotificationReceiver(const NotificationReceiver&) = delete;
  NotificationReceiver& operator=(const NotificationReceiver&) = delete;

  const Endpoint& endpoint() const;
  // Takes at most `max` entries, oldest first; never blocks on the network.
  std::vector<Notification> drain(size_t max);
  Stats stats() const;

 private:
  struct Loop;
  NotificationReceiver(std::unique_ptr<Acceptor> acceptor, std::unique_ptr<Loop> loop);

  std::unique_ptr<Acceptor> acceptor_;
  std::unique_ptr<Loop> loop_;
};

}  // namespace kvferry::detail
