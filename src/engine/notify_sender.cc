#include "engine/notify_sender.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include "core/auth.h"
#include "core/logging.h"
#include "core/named_thread.h"
#include "engine/notify_wire.h"

namespace kvferry::detail {
namespace {

// How often a wait for an ack looks at the peer's liveness and the stop flag.
constexpr std::chrono::milliseconds kAckSlice{50};
// How long the destructor's kBye may take.
constexpr std::chrono::milliseconds kByeTimeout{200};

std::string_view as_text(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

void NotifyTicket::finish(Status outcome) {
  {
    std::lock_guard lock(mu_);
    if (outcome_) return;
    outcome_ = std::move(outcome);
  }
  cv_.notify_all();
}

std::optional<Status> NotifyTicket::poll() const {
  std::lock_guard lock(mu_);
  return outcome_;
}

std::optional<Status> NotifyTicket::wait_until(Clock::time_point until) const {
  std::unique_lock lock(mu_);
  cv_.wait_until(lock, until, [&] { return outcome_.has_value(); });
  return outcome_;
}

NotificationSender::NotificationSender(std::string peer_name, Endpoint target,
                                       uint64_t target_incarnation, Identity self,
                                       std::shared_ptr<PeerLiveness> liveness)
    : peer_name_(std::move(peer_name)),
      target_(std::move(target)),
      target_incarnation_(target_incarnation),
      self_(std::move(self)),
      liveness_(std::move(liveness)) {}

Result<std::shared_ptr<NotificationSender>> NotificationSender::start(
    std::string peer_name, Endpoint target, uint64_t target_incarnation, Identity self,
    std::shared_ptr<PeerLiveness> liveness) {
  std::shared_ptr<NotificationSender> sender(
      new NotificationSender(std::move(peer_name), std::move(target), target_incarnation,
                             std::move(self), std::move(liveness)));
  NotificationSender* raw = sender.get();
  KVF_ASSIGN_OR_RETURN(sender->thread_, start_named_thread("kvf-notify-tx", [raw] { raw->run(); }));
  return sender;
}

NotificationSender::~NotificationSender() {
  shutdown(Cancelled("the sending engine shut down"), kDrain);
  if (thread_.joinable()) thread_.join();
}

void NotificationSender::enqueue(std::string bytes, Clock::time_point deadline,
                                 std::shared_ptr<NotifyTicket> ticket) {
  {
    std::lock_guard lock(mu_);
    if (!closed_) {
      queue_.push_back(Item{std::move(bytes), deadline, std::move(ticket)});
      cv_.notify_all();
      return;
    }
  }
  ticket->finish(*closed_);  // closed_ is set once and never changes after
}

void NotificationSender::shutdown(const Status& why, Clock::duration drain) {
  {
    std::lock_guard lock(mu_);
    if (!closed_) {
      closed_ = why;
      drain_until_ = Clock::now() + drain;
    }
  }
  cv_.notify_all();
}

void NotificationSender::run() {
  for (;;) {
    Item item;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || closed_.has_value(); });
      if (queue_.empty() || (closed_ && Clock::now() >= drain_until_)) break;
      item = std::move(queue_.front());
      queue_.pop_front();
      if (closed_) item.deadline = std::min(item.deadline, drain_until_);
    }
    Status outcome = deliver(item);
    // A refused size leaves the connection as it was; any other failure leaves it in doubt
    // (an ack may still come), so a later notification connects afresh and re-checks the
    // peer. The goodbye keeps the peer from reporting this engine lost.
    if (!outcome.ok() && outcome.code() != StatusCode::kInvalidArgument) {
      if (connection_.valid()) {
        write_notify_frame(connection_.get(), NotifyFrame::kBye, {}, Clock::now() + kByeTimeout)
            .ignore();
      }
      connection_ = Fd();
    }
    if (!outcome.ok()) log().warn("notification to {}: {}", peer_name_, outcome.message());
    item.ticket->finish(outcome);
  }
  std::deque<Item> left;
  Status why;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    why = *closed_;
  }
  for (Item& item : left) item.ticket->finish(why);
  // Closed on purpose (the peer closed or restarted, this engine shutting down): the goodbye
  // keeps the peer from reporting this engine lost.
  if (connection_.valid()) {
    write_notify_frame(connection_.get(), NotifyFrame::kBye, {}, Clock::now() + kByeTimeout)
        .ignore();
  }
  connection_ = Fd();
}

Status NotificationSender::peer_error(const Status& s) const {
  if (liveness_->is_disconnected()) {
    return PeerDisconnected(
        fmt::format("peer {} disconnected: {}", peer_name_, liveness_->disconnect_reason()));
  }
  if (s.code() == StatusCode::kPeerDisconnected || s.code() == StatusCode::kInternal) {
    return PeerDisconnected(
        fmt::format("peer {}: notification connection lost: {}", peer_name_, s.message()));
  }
  return Status(s.code(), fmt::format("notification to peer {}: {}", peer_name_, s.message()));
}

Status NotificationSender::connect(Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(target_, deadline));
  NotifyHello hello{target_incarnation_, self_.incarnation, self_.name, self_.endpoint};
  KVF_RETURN_IF_ERROR(
      write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline));
  KVF_ASSIGN_OR_RETURN(NotifyMessage reply, read_notify_frame(fd.get(), 0, deadline));
  if (reply.type == NotifyFrame::kError) {
    return PeerDisconnected(fmt::format("refused: {}", as_text(reply.payload)));
  }
  if (reply.type != NotifyFrame::kChallenge) return ProtocolError("expected a challenge");
  KVF_ASSIGN_OR_RETURN(NotifyChallenge challenge, decode_challenge(reply.payload));
  if (!challenge.nonce.empty()) {
    if (!self_.secret) {
      return Unauthenticated("the peer requires a secret and this engine has none");
    }
    AuthProof proof = auth_proof(*self_.secret, std::as_bytes(std::span(challenge.nonce)));
    KVF_RETURN_IF_ERROR(write_notify_frame(fd.get(), NotifyFrame::kProof, proof, deadline));
  }
  KVF_ASSIGN_OR_RETURN(NotifyMessage welcome, read_notify_frame(fd.get(), 0, deadline));
  if (welcome.type == NotifyFrame::kError) {
    const std::string_view why = as_text(welcome.payload);
    if (!challenge.nonce.empty()) return Unauthenticated(fmt::format("refused: {}", why));
    return PeerDisconnected(fmt::format("refused: {}", why));
  }
  if (welcome.type != NotifyFrame::kWelcome) return ProtocolError("expected a welcome");
  peer_max_bytes_ = challenge.max_notification_bytes;
  connection_ = std::move(fd);
  return Status::Ok();
}

bool NotificationSender::peer_gone() {
  // A peer this engine closed is marked disconnected too; what was queued for it before is
  // still delivered (shutdown's drain), so while draining only the connection decides.
  std::lock_guard lock(mu_);
  return !closed_ && liveness_->is_disconnected();
}

Status NotificationSender::deliver(const Item& item) {
  if (peer_gone()) return peer_error(Status::Ok());
  if (Clock::now() >= item.deadline) {
    return Timeout(fmt::format("notification to peer {} not sent before its deadline", peer_name_));
  }
  if (!connection_.valid()) {
    if (Status s = connect(item.deadline); !s.ok()) return peer_error(s);
  }
  if (item.bytes.size() > peer_max_bytes_) {
    return InvalidArgument(fmt::format("notification of {} bytes exceeds peer {}'s limit of {}",
                                       item.bytes.size(), peer_name_, peer_max_bytes_));
  }
  const uint64_t sequence = next_sequence_++;
  if (Status s = write_notify_frame(connection_.get(), NotifyFrame::kNotify,
                                    encode_notify(sequence, item.bytes), item.deadline);
      !s.ok()) {
    return peer_error(s);
  }
  while (!wait_readable(connection_.get(), std::min(item.deadline, Clock::now() + kAckSlice))) {
    if (peer_gone()) return peer_error(Status::Ok());
    {
      std::lock_guard lock(mu_);
      if (closed_ && Clock::now() >= drain_until_) return *closed_;
    }
    if (Clock::now() >= item.deadline) {
      return Timeout(fmt::format("peer {} did not acknowledge notification {} before its deadline",
                                 peer_name_, sequence));
    }
  }
  KVF_ASSIGN_OR_RETURN(NotifyMessage ack, read_notify_frame(connection_.get(), 0, item.deadline));
  if (ack.type == NotifyFrame::kError) {
    return peer_error(ProtocolError(fmt::format("refused: {}", as_text(ack.payload))));
  }
  if (ack.type != NotifyFrame::kAck) return peer_error(ProtocolError("expected an ack"));
  KVF_ASSIGN_OR_RETURN(uint64_t acked, decode_sequence(ack.payload));
  if (acked != sequence) {
    return peer_error(
        ProtocolError(fmt::format("ack for notification {} (expected {})", acked, sequence)));
  }
  return Status::Ok();
}

}  // namespace kvferry::detail
