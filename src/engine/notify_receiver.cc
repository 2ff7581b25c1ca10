#include "engine/notify_receiver.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include "core/auth.h"
#include "core/logging.h"

namespace kvferry::detail {
namespace {

// How often an idle connection looks at the stop flag.
constexpr std::chrono::milliseconds kIdleSlice{100};

std::span<const std::byte> as_bytes(std::string_view s) {
  return std::as_bytes(std::span(s.data(), s.size()));
}

void refuse(int fd, std::string_view why, Clock::time_point deadline) {
  write_notify_frame(fd, NotifyFrame::kError, as_bytes(why.substr(0, kMaxNotifyControlBytes)),
                     deadline)
      .ignore();
}

}  // namespace

Result<std::unique_ptr<NotificationReceiver>> NotificationReceiver::start(Options options) {
  KVF_ASSIGN_OR_RETURN(
      std::unique_ptr<Acceptor> acceptor,
      Acceptor::bind(options.listen, Acceptor::Options::named("notification", 0, options.limits)));
  auto receiver = std::unique_ptr<NotificationReceiver>(
      new NotificationReceiver(std::move(acceptor), std::move(options)));
  receiver->acceptor_->start([r = receiver.get()](Fd conn, ConnectionSlot slot) {
    r->accept(std::move(conn), std::move(slot));
  });
  return receiver;
}

NotificationReceiver::NotificationReceiver(std::unique_ptr<Acceptor> acceptor, Options options)
    : acceptor_(std::move(acceptor)), options_(std::move(options)) {}

NotificationReceiver::~NotificationReceiver() {
  acceptor_->stop();  // no new connection from here on
  stopping_.store(true);
  inbox_room_.notify_all();
  std::lock_guard lock(connections_mu_);
  for (Connection& c : connections_) ::shutdown(c.fd.get(), SHUT_RDWR);
  for (Connection& c : connections_) c.thread.join();
}

void NotificationReceiver::accept(Fd connection, ConnectionSlot slot) {
  std::lock_guard lock(connections_mu_);
  // Reap the connections that ended, so the list holds live ones only.
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->finished.load()) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
  Connection& c = connections_.emplace_back();
  c.fd = std::move(connection);
  c.slot = std::move(slot);
  c.thread = std::thread([this, &c] {
    serve(c);
    c.finished.store(true);
  });
}

Result<NotifyHello> NotificationReceiver::admit(int fd) {
  const auto deadline = Clock::now() + options_.io_timeout;
  KVF_ASSIGN_OR_RETURN(NotifyMessage hello_frame, read_notify_frame(fd, 0, deadline));
  if (hello_frame.type != NotifyFrame::kHello) {
    return ProtocolError(fmt::format("notification: expected a hello, got frame type {}",
                                     static_cast<int>(hello_frame.type)));
  }
  KVF_ASSIGN_OR_RETURN(NotifyHello hello, decode_hello(hello_frame.payload));
  if (hello.target_incarnation != 0 && hello.target_incarnation != options_.incarnation) {
    std::string why = fmt::format("this engine is incarnation {:016x}, not {:016x} (it restarted)",
                                  options_.incarnation, hello.target_incarnation);
    refuse(fd, why, deadline);
    return PeerDisconnected(why);
  }
  NotifyChallenge challenge{options_.incarnation, options_.max_notification_bytes, {}};
  std::optional<AuthNonce> nonce;
  if (options_.secret) {
    KVF_ASSIGN_OR_RETURN(nonce, make_auth_nonce());
    challenge.nonce.assign(reinterpret_cast<const char*>(nonce->data()), nonce->size());
  }
  KVF_RETURN_IF_ERROR(
      write_notify_frame(fd, NotifyFrame::kChallenge, encode_challenge(challenge), deadline));
  if (nonce) {
    KVF_ASSIGN_OR_RETURN(NotifyMessage proof, read_notify_frame(fd, 0, deadline));
    if (proof.type != NotifyFrame::kProof ||
        !auth_proof_matches(auth_proof(*options_.secret, *nonce), proof.payload)) {
      refuse(fd, "authentication failed (wrong secret)", deadline);
      return Unauthenticated(fmt::format("notification sender '{}' ({}) failed authentication",
                                         hello.sender_name, hello.sender_endpoint));
    }
  }
  KVF_RETURN_IF_ERROR(write_notify_frame(fd, NotifyFrame::kWelcome, {}, deadline));
  return hello;
}

void NotificationReceiver::serve(Connection& c) {
  const int fd = c.fd.get();
  Result<NotifyHello> admitted = admit(fd);
  if (!admitted.ok()) {
    if (!stopping_.load()) log().warn("notification: {}", admitted.status().message());
    return;
  }
  const NotifyHello& sender = *admitted;
  std::string lost;  // why the connection ended, unless cleanly
  while (!stopping_.load()) {
    if (!wait_readable(fd, Clock::now() + kIdleSlice)) continue;
    if (stopping_.load()) break;
    Result<NotifyMessage> frame =
        read_notify_frame(fd, options_.max_notification_bytes, Clock::now() + options_.io_timeout);
    if (!frame.ok()) {
      lost = frame.status().message();
      if (frame.status().code() == StatusCode::kProtocolError) {
        refuse(fd, lost, Clock::now() + options_.io_timeout);
      }
      break;
    }
    if (frame->type == NotifyFrame::kBye) break;
    if (frame->type != NotifyFrame::kNotify || frame->payload.size() < 8) {
      lost = fmt::format("unexpected frame type {}", static_cast<int>(frame->type));
      refuse(fd, lost, Clock::now() + options_.io_timeout);
      break;
    }
    const uint64_t sequence = *decode_sequence(std::span(frame->payload).first(8));
    Notification n;
    n.sender = sender.sender_name;
    n.sender_endpoint = sender.sender_endpoint;
    n.sender_incarnation = sender.sender_incarnation;
    n.bytes.assign(reinterpret_cast<const char*>(frame->payload.data()) + 8,
                   frame->payload.size() - 8);
    if (!push(std::move(n))) break;
    Status acked = write_notify_frame(fd, NotifyFrame::kAck, encode_sequence(sequence),
                                      Clock::now() + options_.io_timeout);
    if (!acked.ok()) {
      lost = acked.message();
      break;
    }
  }
  if (lost.empty() || stopping_.load()) return;
  log().warn("notification: lost sender '{}' ({}): {}", sender.sender_name, sender.sender_endpoint,
             lost);
  Notification gone;
  gone.kind = Notification::Kind::kSenderLost;
  gone.sender = sender.sender_name;
  gone.sender_endpoint = sender.sender_endpoint;
  gone.sender_incarnation = sender.sender_incarnation;
  gone.bytes = lost;
  std::lock_guard lock(inbox_mu_);
  inbox_.push_back(std::move(gone));  // may exceed max_pending by one per connection
}

bool NotificationReceiver::push(Notification n) {
  std::unique_lock lock(inbox_mu_);
  inbox_room_.wait(lock, [&] { return stopping_.load() || inbox_.size() < options_.max_pending; });
  if (stopping_.load()) return false;
  inbox_.push_back(std::move(n));
  return true;
}

std::vector<Notification> NotificationReceiver::drain(size_t max) {
  std::vector<Notification> out;
  {
    std::lock_guard lock(inbox_mu_);
    const size_t n = std::min(max, inbox_.size());
    out.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      out.push_back(std::move(inbox_.front()));
      inbox_.pop_front();
    }
  }
  if (!out.empty()) inbox_room_.notify_all();
  return out;
}

}  // namespace kvferry::detail
