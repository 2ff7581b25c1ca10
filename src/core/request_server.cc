#include "core/request_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/log_throttle.h"
#include "core/logging.h"
#include "core/named_thread.h"

namespace kvferry {
namespace {

// How often the loop looks for connections past their deadline (at most this late), while it
// has any: with none it sleeps until one comes, so an idle engine costs no wake-ups.
constexpr int kDeadlineTickMs = 20;
// Bytes received per recv() call.
constexpr size_t kReceiveChunkBytes = 4096;

struct Conn {
  Fd fd;
  ConnectionSlot slot;
  Clock::time_point deadline;
  std::string greeting;  // what was sent on accept (RequestServerOptions::greeting)
  std::string in;        // grows with what arrived, never past max_request_bytes
  std::string out;       // the reply, once the request is complete
  size_t out_sent = 0;
  bool replying = false;
  bool broken = false;  // a send failed
  bool out_sent_all() const { return !broken && out_sent == out.size(); }
  bool draining = false;  // reply out and half-closed: discarding input until the client closes
};

}  // namespace

struct RequestServer::Loop {
  Loop(RequestServerOptions options, Frame frame, Handle handle)
      : options_(std::move(options)),
        frame_(std::move(frame)),
        handle_(std::move(handle)),
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
    KVF_ASSIGN_OR_RETURN(
        thread_, start_named_thread(thread_name("kvf-r-", options_.name), [this] { run(); }));
    return Status::Ok();
  }

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

  uint64_t timed_out() const { return timed_out_.load(); }

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
    Clock::time_point next_check = Clock::now();
    while (!stopping_.load()) {
      const int timeout = conns_.empty() ? -1 : kDeadlineTickMs;
      int n = ::epoll_wait(epoll_.get(), events.data(), events.size(), timeout);
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
        if (!serve(*it->second, events[i].events)) drop(fd);
      }
      const auto now = Clock::now();
      if (now >= next_check) {
        next_check = now + std::chrono::milliseconds(kDeadlineTickMs);
        drop_late(now);
      }
    }
  }

  void take_incoming() {
    std::vector<Incoming> fresh;
    {
      std::lock_guard lock(mu_);
      fresh.swap(incoming_);
    }
    const auto deadline = Clock::now() + options_.limits.hello_timeout;
    for (Incoming& in : fresh) {
      if (in.slot.evicted()) continue;  // closed to make room while it waited here
      const int raw = in.fd.get();
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = raw;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;
      auto conn = std::make_unique<Conn>();
      conn->fd = std::move(in.fd);
      conn->slot = std::move(in.slot);
      conn->deadline = deadline;
      if (options_.greeting && !greet(*conn)) {
        ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, raw, nullptr);
        continue;  // closes it
      }
      conns_.emplace(raw, std::move(conn));
    }
  }

  // Sends the greeting whole in one non-blocking send: a fresh connection's send buffer
  // takes a few hundred bytes, so anything less means the connection is unusable.
  bool greet(Conn& c) {
    c.greeting = options_.greeting();
    if (c.greeting.empty()) return true;
    ssize_t n =
        ::send(c.fd.get(), c.greeting.data(), c.greeting.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    return n == static_cast<ssize_t>(c.greeting.size());
  }

  void drop(int fd) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, fd, nullptr);
    conns_.erase(fd);  // closes the socket and frees its slot
  }

  void drop_late(Clock::time_point now) {
    std::vector<int> late;
    for (const auto& [fd, conn] : conns_) {
      if (now > conn->deadline) late.push_back(fd);
    }
    if (late.empty()) return;
    timed_out_.fetch_add(late.size());
    log().debug("{}: closed {} connections that did not finish within {} ms", options_.name,
                late.size(), options_.limits.hello_timeout.count());
    for (int fd : late) drop(fd);
  }

  // False: the connection is done (served, refused, closed by the client, or broken).
  bool serve(Conn& c, uint32_t events) {
    if (c.draining) return discard_input(c);
    if (!c.replying && (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0 && !receive(c)) return false;
    if (!c.replying || send_reply(c)) return true;
    // The reply is out. Closing now, with input unread (a refused request's rest), would send
    // a reset that can destroy the reply before the client reads it: half-close instead and
    // discard what still comes until the client closes (or the deadline).
    if (!c.out_sent_all()) return false;
    ::shutdown(c.fd.get(), SHUT_WR);
    c.draining = true;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = c.fd.get();
    return ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) == 0 && discard_input(c);
  }

  // False once the client has closed (or the connection broke).
  static bool discard_input(Conn& c) {
    for (;;) {
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): drained into, never read
      std::array<char, kReceiveChunkBytes> sink;
      ssize_t n = ::recv(c.fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }

  bool receive(Conn& c) {
    for (;;) {
      // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init): received into, then read
      std::array<char, kReceiveChunkBytes> chunk;
      ssize_t n = ::recv(c.fd.get(), chunk.data(), chunk.size(), MSG_DONTWAIT);
      if (n == 0) return false;  // the client went away before its request was complete
      if (n < 0) {
        if (errno == EINTR) continue;
        return errno == EAGAIN || errno == EWOULDBLOCK;
      }
      c.in.append(chunk.data(), static_cast<size_t>(n));
      RequestFraming framing = frame_(std::as_bytes(std::span(c.in)));
      switch (framing.kind) {
        case RequestFraming::Kind::kNeedMore:
          if (c.in.size() >= options_.max_request_bytes) {
            oversized_log_.warn(
                "{}: closed a connection from {} whose request is not complete after {} bytes",
                options_.name, c.slot.source(), c.in.size());
            return false;
          }
          continue;
        case RequestFraming::Kind::kRefuse: c.out = std::move(framing.reply); break;
        case RequestFraming::Kind::kComplete:
          c.out = handle_(std::as_bytes(std::span(c.in).first(framing.request_bytes)),
                          RequestPeer{c.slot.source(), c.greeting});
          break;
      }
      // Served now: no longer one the acceptor may close to make room; if it just did, the
      // socket is shut down and the reply could not go out anyway.
      if (!c.slot.mark_engaged()) return false;
      c.replying = true;
      c.in = std::string();
      epoll_event ev{};
      ev.events = EPOLLOUT;
      ev.data.fd = c.fd.get();
      return ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) == 0;
    }
  }

  // True while some of the reply is still to go; false once it is out (out_sent_all()) or
  // cannot be sent.
  static bool send_reply(Conn& c) {
    while (c.out_sent < c.out.size()) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent,
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        c.broken = true;
        return false;
      }
      c.out_sent += static_cast<size_t>(n);
    }
    return false;
  }

  RequestServerOptions options_;
  Frame frame_;
  Handle handle_;
  Fd epoll_;
  Fd wake_;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> timed_out_{0};
  LogThrottle oversized_log_;
  std::mutex mu_;
  std::vector<Incoming> incoming_;                        // guarded by mu_
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;  // loop thread only
  std::thread thread_;
};

Result<std::unique_ptr<RequestServer>> RequestServer::start(const Endpoint& listen,
                                                            RequestServerOptions options,
                                                            Frame frame, Handle handle) {
  Acceptor::Options accepting =
      Acceptor::Options::named(options.name, SOCK_NONBLOCK, options.limits);
  accepting.evict_idle = true;  // the loop marks each connection engaged once its request is in
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Acceptor> acceptor,
                       Acceptor::bind(listen, std::move(accepting)));
  auto loop = std::make_unique<Loop>(std::move(options), std::move(frame), std::move(handle));
  KVF_RETURN_IF_ERROR(loop->start());
  auto server =
      std::unique_ptr<RequestServer>(new RequestServer(std::move(acceptor), std::move(loop)));
  KVF_RETURN_IF_ERROR(
      server->acceptor_->start([l = server->loop_.get()](Fd fd, ConnectionSlot slot) {
        l->adopt(std::move(fd), std::move(slot));
      }));
  return server;
}

RequestServer::RequestServer(std::unique_ptr<Acceptor> acceptor, std::unique_ptr<Loop> loop)
    : acceptor_(std::move(acceptor)), loop_(std::move(loop)) {}

RequestServer::~RequestServer() {
  acceptor_->stop();  // before the loop goes: the acceptor hands connections to it
  loop_.reset();
}

const Endpoint& RequestServer::endpoint() const { return acceptor_->endpoint(); }
uint32_t RequestServer::open_connections() const { return acceptor_->open_connections(); }
uint64_t RequestServer::timed_out() const { return loop_->timed_out(); }
uint64_t RequestServer::evicted() const { return acceptor_->evicted(); }
uint64_t RequestServer::refused() const { return acceptor_->refused(); }

}  // namespace kvferry
