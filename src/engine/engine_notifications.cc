#include <fmt/format.h>

#include "engine/engine_impl.h"

namespace kvferry::detail {

Result<std::shared_ptr<NotificationSender>> EngineImpl::notification_sender(PeerState& peer,
                                                                            size_t bytes) {
  if (bytes > options_.max_notification_bytes) {
    return InvalidArgument(fmt::format("notification of {} bytes exceeds max_notification_bytes {}",
                                       bytes, options_.max_notification_bytes));
  }
  if (options_.name.size() > kMaxNotifySenderNameBytes) {
    return InvalidArgument(fmt::format(
        "this engine's name of {} bytes exceeds the {} bytes a notification's sender may have",
        options_.name.size(), kMaxNotifySenderNameBytes));
  }
  if (endpoint_.size() > kMaxNotifySenderEndpointBytes) {
    return InvalidArgument(fmt::format(
        "this engine's endpoint of {} bytes exceeds the {} bytes a notification's sender may "
        "have",
        endpoint_.size(), kMaxNotifySenderEndpointBytes));
  }
  if (peer.is_disconnected()) {
    return PeerDisconnected("peer " + peer.name + " disconnected: " + peer.disconnect_reason());
  }
  std::string target;
  if (peer.is_self) {
    target = reachable_via(notifications_->endpoint().to_string(), parse_endpoint(endpoint_)->host);
  } else {
    target = peer.segment.load()->descriptor.notify_endpoint;
    if (target.empty()) {
      return NotSupported(
          fmt::format("peer {} takes no notifications (its descriptor has no "
                      "notify_endpoint: an older kvferry)",
                      peer.name));
    }
  }
  std::lock_guard lock(notify_mu_);
  auto it = notify_senders_.find(peer.name);
  if (it == notify_senders_.end() || it->second->target_incarnation() != peer.incarnation) {
    KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(target));
    NotificationSender::Identity self{options_.name, endpoint_, incarnation_, secret_};
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<NotificationSender> sender,
                         NotificationSender::start(peer.name, std::move(endpoint), peer.incarnation,
                                                   std::move(self), peer.liveness));
    if (it != notify_senders_.end()) {
      it->second->shutdown(PeerDisconnected("peer " + peer.name + " restarted"));
      it->second = std::move(sender);
    } else {
      it = notify_senders_.emplace(peer.name, std::move(sender)).first;
    }
  }
  return it->second;
}

void EngineImpl::drop_notification_sender(const std::string& peer_name, const Status& why) {
  std::shared_ptr<NotificationSender> sender;
  {
    std::lock_guard lock(notify_mu_);
    auto it = notify_senders_.find(peer_name);
    if (it == notify_senders_.end()) return;
    sender = std::move(it->second);
    notify_senders_.erase(it);
  }
  sender->shutdown(why, NotificationSender::kDrain);
}

Status EngineImpl::send_notification(const PeerHandle& handle, std::string_view bytes,
                                     std::chrono::milliseconds timeout) {
  if (!handle.valid()) return InvalidArgument("send_notification: invalid peer handle");
  if (timeout.count() < 0 || timeout > kMaxBatchTimeout) {
    return InvalidArgument(fmt::format("send_notification: timeout {} ms out of range 0..{} ms",
                                       timeout.count(), kMaxBatchTimeout.count()));
  }
  KVF_ASSIGN_OR_RETURN(auto sender, notification_sender(*handle.state_, bytes.size()));
  const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : options_.batch_timeout);
  auto ticket = std::make_shared<NotifyTicket>();
  sender->enqueue(std::string(bytes), deadline, ticket);
  // The sender ends every ticket by its deadline; the slack covers its last poll slice.
  std::optional<Status> outcome = ticket->wait_until(deadline + std::chrono::seconds(1));
  if (!outcome) return Timeout("send_notification: no outcome by the deadline");
  return *outcome;
}

std::vector<Notification> EngineImpl::get_notifications(size_t max) {
  return notifications_->drain(max);
}

}  // namespace kvferry::detail
