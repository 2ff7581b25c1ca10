#include "engine/notify_receiver.h"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/auth.h"
#include "core/fd.h"
#include "core/log_throttle.h"
#include "core/logging.h"
#include "core/named_thread.h"
#include "engine/engine_metrics.h"
#include "engine/notify_connection.h"
#include "engine/notify_inbox.h"

namespace kvferry::detail {
namespace {

// How often the loop looks at deadlines and retries the connections held back (so at most
// this late), besides the wake-up a drain sends; only while there is either: an idle receiver
// (its connections between frames, none held back) sleeps until something comes.
constexpr int kTickMs = 20;
// The longest message of a kError frame this receiver sends.
constexpr size_t kMaxRefusalBytes = 256;

using Conn = NotifyConnection;
using Phase = NotifyPhase;
constexpr Clock::time_point kNever = kNotifyNever;

}  // namespace

struct NotificationReceiver::Loop {
  explicit Loop(Options options)
      : options_(std::move(options)),
        inbox_(NotifyInbox::Limits{options_.max_pending, options_.max_pending_bytes}),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  Status start() {
    if (!epoll_.valid()) return ErrnoStatus(StatusCode::kInternal, "epoll_create1", errno);
    if (!wake_.valid()) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_.get();
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl", errno);
    }
    KVF_ASSIGN_OR_RETURN(thread_, start_named_thread("kvf-notify", [this] { run(); }));
    return Status::Ok();
  }

  // Closes every connection without an inbox entry: the owner is going away.
  ~Loop() {
    stopping_.store(true);
    signal();
    if (thread_.joinable()) thread_.join();
  }

  void adopt(Fd fd, ConnectionSlot slot) {
    {
      std::lock_guard lock(mu_);
      incoming_.push_back({std::move(fd), std::move(slot)});
    }
    signal();
  }

  std::vector<Notification> drain(size_t max) {
    std::vector<Notification> out = inbox_.drain(max);
    if (!out.empty()) {
      room_changed_.store(true);
      if (waiting_count_.load() > 0) signal();
    }
    return out;
  }

  Stats stats() const {
    const NotifyInbox::Usage usage = inbox_.usage();
    Stats s;
    s.connections = connection_count_.load();
    s.waiting = waiting_count_.load();
    s.inbox_entries = usage.entries;
    s.inbox_bytes = usage.bytes;
    s.buffered_bytes = buffered_bytes_.load();
    s.welcomed = welcomed_.load();
    s.held_back = held_back_.load();
    s.dropped = dropped_.load();
    return s;
  }

 private:
  struct Incoming {
    Fd fd;
    ConnectionSlot slot;
  };

  void signal() {
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void run() {
    std::array<epoll_event, 64> events{};
    Clock::time_point next_tick = Clock::now();
    bool ticking = true;
    while (!stopping_.load()) {
      const int n =
          ::epoll_wait(epoll_.get(), events.data(), events.size(), ticking ? kTickMs : -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_.get()) {
          uint64_t drained = 0;
          [[maybe_unused]] ssize_t r = ::read(wake_.get(), &drained, sizeof(drained));
          take_incoming();
          continue;
        }
        auto it = conns_.find(fd);
        if (it == conns_.end()) continue;
        serve(*it->second, events[i].events);
        settle(fd);
      }
      const auto now = Clock::now();
      const bool tick = now >= next_tick;
      if (room_changed_.exchange(false) || tick) retry_waiting();
      if (tick) {
        next_tick = now + std::chrono::milliseconds(kTickMs);
        ticking = enforce_deadlines(now) || !waiting_fds_.empty();
      }
      if (n > 0) ticking = true;  // what came may have set a deadline: looked at next tick
    }
  }

  void take_incoming() {
    std::vector<Incoming> fresh;
    {
      std::lock_guard lock(mu_);
      fresh.swap(incoming_);
    }
    const auto deadline = Clock::now() + options_.io_timeout;
    for (Incoming& in : fresh) {
      const int raw = in.fd.get();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = raw;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;  // closes it
      auto conn = std::make_unique<Conn>();
      conn->fd = std::move(in.fd);
      conn->slot = std::move(in.slot);
      conn->deadline = deadline;
      conn->events = EPOLLIN;
      conns_.emplace(raw, std::move(conn));
      connection_count_.fetch_add(1);
    }
  }

  void serve(Conn& c, uint32_t events) {
    if ((events & EPOLLOUT) != 0) flush(c);
    if (c.closed) return;
    const bool reading = (c.events & EPOLLIN) != 0;
    if (!reading && (events & (EPOLLERR | EPOLLHUP)) != 0) {
      end(c, "the connection broke");  // reset while it was not being read
      return;
    }
    if (c.phase == Phase::kClosing) {
      if (!c.discard_input()) c.closed = true;
    } else if (reading && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) {
      receive(c);
    }
  }

  // After anything happened to `fd`: removes it if it is done, else brings what epoll
  // watches and the buffer count up to date.
  void settle(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    Conn& c = *it->second;
    const size_t bytes = c.closed ? 0 : c.buffer_bytes();
    buffered_bytes_.fetch_add(bytes);
    buffered_bytes_.fetch_sub(c.accounted_bytes);
    c.accounted_bytes = bytes;
    if (c.closed) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
      forget_waiting(fd);
      conns_.erase(it);  // closes the socket, frees its buffers and its slot
      connection_count_.fetch_sub(1);
      return;
    }
    uint32_t want = 0;
    if (wants_input(c) || c.phase == Phase::kClosing) want |= EPOLLIN;
    if (c.untaken() > 0) want |= EPOLLOUT;
    if (want == c.events) return;
    epoll_event ev{};
    ev.events = want;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev) == 0) c.events = want;
  }

  bool wants_input(const Conn& c) const {
    return !c.closed && c.phase != Phase::kClosing && !c.waiting &&
           c.untaken() < kMaxUntakenNotifyReplyBytes;
  }

  // Reads what is there, one frame at a time and never past the frame being received, until
  // the socket is empty or the connection must not be read (waiting, or replies untaken).
  void receive(Conn& c) {
    while (wants_input(c)) {
      const bool frame_starts = c.in.empty();
      const ssize_t n = c.receive_some();
      if (n == 0) {
        end(c, frame_starts ? "the connection closed without a goodbye"
                            : "the connection closed in the middle of a frame");
        return;
      }
      if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK) end(c, std::strerror(errno));
        return;
      }
      if (frame_starts && c.phase == Phase::kServing) {
        c.deadline = Clock::now() + options_.io_timeout;  // the frame's own
      }
      if (!c.header && c.in.size() == kFrameHeaderBytes && !take_header(c)) return;
      if (c.frame_complete()) on_frame(c);
    }
  }

  bool take_header(Conn& c) {
    Result<FrameHeader> h = decode_frame_header(kNotifyFormat, c.in, UINT32_MAX);
    if (!h.ok()) {
      refuse(c, h.status().message());
      return false;
    }
    const auto type = static_cast<NotifyFrame>(h->type);
    const std::optional<uint32_t> bound =
        notify_frame_bound(c.phase, type, options_.max_notification_bytes);
    if (!bound) {
      refuse(c, fmt::format("notification: expected {}, got frame type {}",
                            notify_phase_expects(c.phase), h->type));
      return false;
    }
    if (h->payload_bytes > *bound) {
      refuse(c, fmt::format("notification frame of type {} carries {} bytes (limit {})", h->type,
                            h->payload_bytes, *bound));
      return false;
    }
    c.header = *h;
    return true;
  }

  void on_frame(Conn& c) {
    const auto type = static_cast<NotifyFrame>(c.header->type);
    const std::span<const std::byte> payload(c.in.data() + kFrameHeaderBytes,
                                             c.header->payload_bytes);
    switch (c.phase) {
      case Phase::kHello: on_hello(c, payload); break;
      case Phase::kProof: on_proof(c, payload); break;
      case Phase::kServing:
        if (type == NotifyFrame::kBye) {
          end(c, {});
        } else {
          on_notify(c, payload);
        }
        break;
      case Phase::kClosing: break;
    }
    c.consume_frame();
    if (c.phase == Phase::kServing) c.deadline = kNever;  // until the next frame starts
  }

  void on_hello(Conn& c, std::span<const std::byte> payload) {
    Result<NotifyHello> hello = decode_hello(payload);
    if (!hello.ok()) {
      refuse(c, hello.status().message());
      return;
    }
    if (hello->target_incarnation != 0 && hello->target_incarnation != options_.incarnation) {
      refuse(c, fmt::format("this engine is incarnation {:016x}, not {:016x} (it restarted)",
                            options_.incarnation, hello->target_incarnation));
      return;
    }
    NotifyChallenge challenge{options_.incarnation, options_.max_notification_bytes, {}};
    if (options_.secret) {
      Result<AuthNonce> nonce = make_auth_nonce();
      if (!nonce.ok()) {
        refuse(c, nonce.status().message());
        return;
      }
      c.nonce = *nonce;
      challenge.nonce.assign(reinterpret_cast<const char*>(nonce->data()), nonce->size());
    }
    c.hello = std::move(*hello);
    reply(c, NotifyFrame::kChallenge, encode_challenge(challenge));
    if (c.closed) return;
    if (c.nonce) {
      c.phase = Phase::kProof;
    } else {
      welcome(c);
    }
  }

  void on_proof(Conn& c, std::span<const std::byte> payload) {
    if (!auth_proof_matches(auth_proof(*options_.secret, *c.nonce), payload)) {
      refuse(c, "authentication failed (wrong secret)");
      return;
    }
    c.proven = true;
    welcome(c);
  }

  void welcome(Conn& c) {
    reply(c, NotifyFrame::kWelcome, {});
    if (c.closed) return;
    c.phase = Phase::kServing;
    c.deadline = kNever;
    welcomed_.fetch_add(1);
    // A proven sender's loss is reported even before it delivers: reserve its room now if
    // there is some (else its first notification reserves it).
    if (c.proven) {
      const size_t cost = lost_cost(c);
      if (inbox_.try_reserve(identity_of(c), cost) == NotifyInbox::Outcome::kAdded) {
        c.lost_reserved_bytes = cost;
      }
    }
  }

  void on_notify(Conn& c, std::span<const std::byte> payload) {
    if (payload.size() < 8) {
      refuse(c,
             fmt::format("notification frame of {} bytes has no sequence number", payload.size()));
      return;
    }
    Notification n = identity_of(c);
    n.kind = Notification::Kind::kMessage;
    n.bytes.assign(reinterpret_cast<const char*>(payload.data()) + 8, payload.size() - 8);
    c.waiting = std::move(n);
    c.waiting_sequence = *decode_sequence(payload.first(8));
    if (!admit_waiting(c)) {
      waiting_fds_.push_back(c.fd.get());
      waiting_count_.store(waiting_fds_.size());
    }
  }

  // Moves the waiting notification into the inbox and acknowledges it, if there is room.
  bool admit_waiting(Conn& c) {
    const size_t reserve = c.lost_reserved_bytes > 0 ? 0 : lost_cost(c);
    const NotifyInbox::Outcome outcome = inbox_.try_push(*c.waiting, reserve);
    if (outcome == NotifyInbox::Outcome::kAdded) {
      c.lost_reserved_bytes += reserve;
      c.delivered = true;
      c.waiting.reset();
      c.counted_held_back = false;
      reply(c, NotifyFrame::kAck, encode_sequence(c.waiting_sequence));
      return true;
    }
    if (!c.counted_held_back) {
      c.counted_held_back = true;
      held_back_.fetch_add(1);
      const bool share = outcome == NotifyInbox::Outcome::kOverShare;
      if (options_.metrics != nullptr) {
        options_.metrics->on_notification_held_back(share ? NotifyHoldBack::kSenderShare
                                                          : NotifyHoldBack::kInboxFull);
      }
      const NotifyInbox::Usage usage = inbox_.usage();
      held_back_log_.warn(
          "notification: sender '{}' ({}) {}; its connection is not read until "
          "get_notifications makes room (inbox: {} of {} entries, {} of {} bytes, {} senders)",
          c.hello.sender_name, c.hello.sender_endpoint,
          share ? "holds its share of the inbox" : "finds the inbox full", usage.entries,
          options_.max_pending, usage.bytes, options_.max_pending_bytes, usage.senders);
    }
    return false;
  }

  void retry_waiting() {
    if (waiting_fds_.empty()) return;
    const std::vector<int> waiting = waiting_fds_;
    for (int fd : waiting) {
      auto it = conns_.find(fd);
      if (it == conns_.end() || !it->second->waiting) continue;
      if (admit_waiting(*it->second)) forget_waiting(fd);
      settle(fd);
    }
  }

  void forget_waiting(int fd) {
    auto it = std::find(waiting_fds_.begin(), waiting_fds_.end(), fd);
    if (it == waiting_fds_.end()) return;
    waiting_fds_.erase(it);
    waiting_count_.store(waiting_fds_.size());
  }

  // Ends the connections past a deadline. Whether any deadline is still ahead.
  bool enforce_deadlines(Clock::time_point now) {
    std::vector<int> touched;
    bool ahead = false;
    for (auto& [fd, conn] : conns_) {
      Conn& c = *conn;
      if (now <= c.deadline && now <= c.out_deadline) {
        ahead = ahead || c.deadline != kNever || c.out_deadline != kNever;
        continue;
      }
      if (now > c.out_deadline && c.phase != Phase::kClosing) {
        end(c, fmt::format("the sender took no reply for {} ms", options_.io_timeout.count()));
      } else {
        switch (c.phase) {
          case Phase::kHello:
          case Phase::kProof:
            refusals_log_.warn(
                "notification: closed a connection from {} that did not finish its "
                "setup within {} ms",
                c.slot.source(), options_.io_timeout.count());
            c.closed = true;
            break;
          case Phase::kServing:
            end(c, fmt::format("a frame did not arrive whole within {} ms",
                               options_.io_timeout.count()));
            break;
          case Phase::kClosing: c.closed = true; break;
        }
      }
      touched.push_back(fd);
    }
    for (int fd : touched) settle(fd);
    return ahead || !touched.empty();
  }

  // Queues a frame and sends what the socket takes now.
  void reply(Conn& c, NotifyFrame type, std::span<const std::byte> payload) {
    c.queue(type, payload);
    flush(c);
  }

  void flush(Conn& c) {
    if (c.send_some(options_.io_timeout)) return;
    if (c.phase == Phase::kClosing) {
      c.closed = true;
    } else {
      end(c, fmt::format("sending to the sender failed: {}", std::strerror(errno)));
    }
  }

  // Sends a kError frame naming `why`, ends the sender (a lost one, if it had delivered or
  // proved), and closes once the frame is out.
  void refuse(Conn& c, const std::string& why) {
    if (c.phase != Phase::kServing) {
      refusals_log_.warn("notification: refused a connection from {}: {}", c.slot.source(), why);
    }
    end(c, why);
    c.closed = false;
    c.phase = Phase::kClosing;
    c.deadline = Clock::now() + options_.io_timeout;
    c.consume_frame();
    const std::string_view message = std::string_view(why).substr(0, kMaxRefusalBytes);
    reply(c, NotifyFrame::kError, std::as_bytes(std::span(message.data(), message.size())));
  }

  // The connection is over: `why` empty when the sender said goodbye. A welcomed sender that
  // had proved or delivered, and ended otherwise, leaves its kSenderLost entry.
  void end(Conn& c, std::string_view why) {
    c.closed = true;
    if (c.phase != Phase::kServing) return;
    c.phase = Phase::kClosing;
    if (c.waiting) {
      c.waiting.reset();
      drop(NotifyDrop::kUnacknowledged, c, "a notification it sent was not acknowledged");
    }
    room_changed_.store(true);
    Notification lost = identity_of(c);
    if (why.empty()) {
      if (c.lost_reserved_bytes > 0) inbox_.release(lost, c.lost_reserved_bytes);
      return;
    }
    if (!c.proven && !c.delivered) {
      log().debug("notification: a connection from {} that delivered nothing ended: {}",
                  c.slot.source(), why);
      return;
    }
    lost_log_.warn("notification: lost sender '{}' ({}): {}", c.hello.sender_name,
                   c.hello.sender_endpoint, why);
    lost.bytes = why.substr(0, kMaxSenderLostReasonBytes);
    if (c.lost_reserved_bytes > 0) {
      inbox_.push_reserved(std::move(lost), c.lost_reserved_bytes);
    } else if (inbox_.try_push(lost, 0) != NotifyInbox::Outcome::kAdded) {
      drop(NotifyDrop::kSenderLost, c, "the inbox has no room to report its loss");
    }
    c.lost_reserved_bytes = 0;
  }

  void drop(NotifyDrop what, const Conn& c, std::string_view why) {
    dropped_.fetch_add(1);
    if (options_.metrics != nullptr) options_.metrics->on_notification_dropped(what);
    dropped_log_.warn("notification: dropped an entry of sender '{}' ({}): {}", c.hello.sender_name,
                      c.hello.sender_endpoint, why);
  }

  // The sender of `c`, as its inbox entries name it (a kSenderLost entry until told else).
  static Notification identity_of(const Conn& c) {
    Notification n;
    n.kind = Notification::Kind::kSenderLost;
    n.sender = c.hello.sender_name;
    n.sender_endpoint = c.hello.sender_endpoint;
    n.sender_incarnation = c.hello.sender_incarnation;
    return n;
  }

  static size_t lost_cost(const Conn& c) {
    return NotifyInbox::lost_entry_cost(c.hello.sender_name, c.hello.sender_endpoint);
  }

  const Options options_;
  NotifyInbox inbox_;
  Fd epoll_;
  Fd wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> room_changed_{false};  // a drain or an end made room
  std::mutex mu_;
  std::vector<Incoming> incoming_;  // guarded by mu_

  // The loop thread's own.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  std::vector<int> waiting_fds_;  // connections held back, in the order they were

  // Stats.
  std::atomic<size_t> connection_count_{0};
  std::atomic<size_t> waiting_count_{0};
  std::atomic<size_t> buffered_bytes_{0};
  std::atomic<uint64_t> welcomed_{0};
  std::atomic<uint64_t> held_back_{0};
  std::atomic<uint64_t> dropped_{0};

  // A flood repeats each of these thousands of times a second.
  LogThrottle refusals_log_;
  LogThrottle lost_log_;
  LogThrottle held_back_log_;
  LogThrottle dropped_log_;

  std::thread thread_;  // last: starts once the rest is built
};

Result<std::unique_ptr<NotificationReceiver>> NotificationReceiver::start(Options options) {
  KVF_ASSIGN_OR_RETURN(
      std::unique_ptr<Acceptor> acceptor,
      Acceptor::bind(options.listen,
                     Acceptor::Options::named("notification", SOCK_NONBLOCK, options.limits)));
  auto loop = std::make_unique<Loop>(std::move(options));
  KVF_RETURN_IF_ERROR(loop->start());
  auto receiver = std::unique_ptr<NotificationReceiver>(
      new NotificationReceiver(std::move(acceptor), std::move(loop)));
  KVF_RETURN_IF_ERROR(
      receiver->acceptor_->start([l = receiver->loop_.get()](Fd conn, ConnectionSlot slot) {
        l->adopt(std::move(conn), std::move(slot));
      }));
  return receiver;
}

NotificationReceiver::NotificationReceiver(std::unique_ptr<Acceptor> acceptor,
                                           std::unique_ptr<Loop> loop)
    : acceptor_(std::move(acceptor)), loop_(std::move(loop)) {}

NotificationReceiver::~NotificationReceiver() {
  acceptor_->stop();  // before the loop goes: the acceptor hands connections to it
  loop_.reset();
}

const Endpoint& NotificationReceiver::endpoint() const { return acceptor_->endpoint(); }

std::vector<Notification> NotificationReceiver::drain(size_t max) { return loop_->drain(max); }

NotificationReceiver::Stats NotificationReceiver::stats() const { return loop_->stats(); }

}  // namespace kvferry::detail
