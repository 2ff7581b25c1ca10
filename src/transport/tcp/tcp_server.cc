#include "transport/tcp/tcp_server.h"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <unordered_map>

#include "core/logging.h"
#include "core/named_thread.h"
#include "transport/tcp/tcp_server_io.h"

namespace kvferry {

TcpServer::IoThread::IoThread(const TcpServerOptions& options, RegionSource regions,
                              std::shared_ptr<TcpDeviceReadService> reads)
    : options_(options),
      regions_(std::move(regions)),
      reads_(std::move(reads)),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)),
      wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_.get();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
}

Status TcpServer::IoThread::start() {
  KVF_ASSIGN_OR_RETURN(thread_, start_named_thread("kvf-tcp-srv", [this] { loop(); }));
  return Status::Ok();
}

TcpServer::IoThread::~IoThread() {
  stopping_.store(true);
  signal();
  if (thread_.joinable()) thread_.join();
  inbox_->close();  // the shared read stager may outlive this thread
}

void TcpServer::IoThread::adopt(Fd fd, ConnectionSlot slot) {
  {
    std::lock_guard lock(mu_);
    incoming_.push_back({std::move(fd), std::move(slot)});
  }
  signal();
}

void TcpServer::IoThread::loop() {
  std::array<epoll_event, 64> events{};
  while (!stopping_.load()) {
    // Sleeps until the next limit check is due (none while every connection is idle and no
    // idle timeout is set), so a write whose sender went silent mid-payload gives up its pin
    // at its deadline and an idle receiver costs no wake-ups.
    const Clock::time_point began = Clock::now();
    const bool hot = spin_.spinning();
    // In a spell, most polls read the connection whose request began it: one recvmsg, where
    // epoll_wait and then recvmsg would be two on the answer's path. Every kEpollEvery-th
    // poll asks epoll, for the other connections; so does the next one after a wake-up
    // (a connection adopted, a device read staged).
    const bool direct = hot && !signalled_.load(std::memory_order_acquire) &&
                        conns_.contains(spell_fd_) && ++spell_polls_ % kEpollEvery != 0;
    int n = 1;
    if (direct) {
      events[0].events = EPOLLIN;
      events[0].data.fd = spell_fd_;
    } else {
      n = ::epoll_wait(epoll_.get(), events.data(), events.size(),
                       hot ? 0 : milliseconds_until(next_limit_check_ns_, steady_ns(began)));
      if (hot && n == 0) spin_.keep_polling(began, Clock::now());
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    const int64_t now = monotonic_ns();
    if (now >= next_limit_check_ns_) next_limit_check_ns_ = enforce_limits(now);
    // What came may start a frame or a connection: looked at within kLimitCheckNs.
    if (n > 0) next_limit_check_ns_ = std::min(next_limit_check_ns_, now + kLimitCheckNs);
    requests_ = 0;
    request_bytes_ = 0;
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == wake_.get()) {
        signalled_.store(false, std::memory_order_relaxed);  // before the read: none is lost
        uint64_t drained;
        [[maybe_unused]] ssize_t r = ::read(wake_.get(), &drained, sizeof(drained));
        take_incoming();
        take_staged_reads();
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Conn& c = *it->second;
      bool alive = true;
      if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) alive = on_readable(c);
      if (alive && (events[i].events & EPOLLOUT) != 0) alive = flush(c);
      if (alive && c.reading_paused && queued_replies(c) < options_.max_queued_replies) {
        c.reading_paused = false;  // the peer took replies: act on what is buffered
        alive = on_readable(c);
      }
      if (alive) alive = update_interest(c);
      if (!alive) drop(fd);
    }
    if (requests_ == 1 && request_bytes_ <= kTcpHotRequestBytes) {  // see kTcpHotTime
      spin_.settle();
      spin_.open(Clock::now(), kTcpHotTime);
      spell_fd_ = request_fd_;
    } else if (requests_ != 0) {
      spin_.stop();
    } else if (direct) {
      spin_.keep_polling(began, Clock::now());
    }
  }
}

int64_t TcpServer::IoThread::enforce_limits(int64_t now) {
  const int64_t hello_ns = nanoseconds(options_.limits.hello_timeout);
  const int64_t idle_ns = nanoseconds(options_.limits.idle_timeout);
  const int64_t stall_ns = nanoseconds(options_.stall_timeout);
  const int64_t frame_ns = nanoseconds(options_.frame_rest_timeout);
  std::vector<std::pair<int, const char*>> closing;
  int64_t next = kNoLimitCheck;
  for (auto& [fd, conn] : conns_) {
    Conn& c = *conn;
    if (c.drain_until_ns != 0) {
      if (now > c.drain_until_ns) {
        closing.emplace_back(fd, nullptr);
      } else {
        next = std::min(next, c.drain_until_ns);
      }
      continue;
    }
    if ((c.in == InState::kPayload || c.in == InState::kVecPayload) &&
        past_landing_deadline(c, now)) {
      expire(c);
    }
    const bool established = c.hello_done && (!options_.secret || c.authenticated);
    const bool in_frame = c.in != InState::kHeader || c.header_have != 0;
    const bool mid_frame = in_frame || c.in_pos < c.in_end;
    if (!established && now - c.accepted_ns > hello_ns) {
      closing.emplace_back(fd, "hello not finished in time");
    } else if (in_frame && !c.reading_paused && now - c.frame_began_ns > frame_ns) {
      log_frame_overdue(c, now);
      closing.emplace_back(fd, nullptr);
    } else if (mid_frame && !c.reading_paused && now - c.last_in_ns > stall_ns) {
      closing.emplace_back(fd, "request payload stalled");
    } else if (!c.out.empty() && now - c.out_since_ns > stall_ns) {
      closing.emplace_back(fd, "replies not read");
    } else if (!established || mid_frame || !c.out.empty() || c.staging_reads != 0) {
      next = std::min(next, now + kLimitCheckNs);  // under way: looked at regularly
    } else if (idle_ns != 0 && now - c.last_in_ns > idle_ns) {
      // Input that came but is not read yet (this check runs before the round's events)
      // is not idleness: a request sent as the timeout ran out must not be lost with it.
      int unread = 0;
      if (::ioctl(c.fd.get(), FIONREAD, &unread) == 0 && unread > 0) {
        next = std::min(next, now + kLimitCheckNs);
      } else {
        closing.emplace_back(fd, nullptr);  // idle: its initiator reopens a lane on next use
      }
    } else if (idle_ns != 0) {
      next = std::min(next, c.last_in_ns + idle_ns + 1);
    }
  }
  // One line per reason and pass: a flood must not flood the log too.
  std::unordered_map<const char*, size_t> counts;
  for (auto [fd, why] : closing) {
    if (why != nullptr) ++counts[why];
    drop(fd);
  }
  for (auto [why, count] : counts) log().warn("tcp: closed {} connection(s): {}", count, why);
  return next;
}

void TcpServer::IoThread::log_frame_overdue(const Conn& c, int64_t now) {
  const int64_t elapsed_ms = (now - c.frame_began_ns) / 1'000'000;
  if (c.in == InState::kHeader) {
    frame_overdue_log_.warn(
        "tcp: closed a connection: a frame header was not complete {} ms after its first byte "
        "({} of {} bytes in after {} ms)",
        options_.frame_rest_timeout.count(), c.header_have, kTcpHeaderBytes, elapsed_ms);
    return;
  }
  const uint64_t received = c.in == InState::kTable  ? c.table_have
                            : c.in == InState::kAuth ? c.proof_have
                                                     : c.current.length - c.remaining;
  frame_overdue_log_.warn(
      "tcp: closed a connection: a frame (type {}, {} bytes at {:#x}) was not complete {} ms "
      "after its first byte ({} bytes of it in after {} ms); nothing of it is acknowledged "
      "and the memory it pinned is released",
      static_cast<int>(c.current.type), c.current.length, c.current.addr,
      options_.frame_rest_timeout.count(), received, elapsed_ms);
}

void TcpServer::IoThread::take_incoming() {
  std::vector<Incoming> fresh;
  {
    std::lock_guard lock(mu_);
    fresh.swap(incoming_);
  }
  const int64_t now = monotonic_ns();
  for (Incoming& in : fresh) {
    Fd& fd = in.fd;
    int raw = fd.get();
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = raw;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw, &ev) != 0) continue;
    auto conn = std::make_unique<Conn>();
    conn->fd = std::move(fd);
    conn->slot = std::move(in.slot);
    conn->accepted_ns = conn->last_in_ns = now;
    conn->serial = ++next_serial_;
    conns_.emplace(raw, std::move(conn));
  }
}

bool TcpServer::IoThread::discard_input(Conn& c) {
  // Drained into, never read: not zeroed.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-member-init)
  std::array<std::byte, 4096> sink;
  for (;;) {
    ssize_t n = ::recv(c.fd.get(), sink.data(), sink.size(), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

Result<std::unique_ptr<TcpServer>> TcpServer::start(const TcpServerOptions& options,
                                                    RegionSource regions) {
  if (options.io_threads < 1 || options.io_threads > 64) {
    return InvalidArgument("tcp io_threads " + std::to_string(options.io_threads) +
                           " out of range 1..64");
  }
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Acceptor> acceptor,
                       Acceptor::bind(options.listen, Acceptor::Options::named("tcp", SOCK_NONBLOCK,
                                                                               options.limits)));
  auto server =
      std::unique_ptr<TcpServer>(new TcpServer(options, std::move(regions), std::move(acceptor)));
  KVF_RETURN_IF_ERROR(server->acceptor_->start([s = server.get()](Fd conn, ConnectionSlot slot) {
    // Without an I/O thread the connection closes: the peer sees it refused.
    if (IoThread* io = s->io_for_next_connection(); io != nullptr) {
      io->adopt(std::move(conn), std::move(slot));
    }
  }));
  return server;
}

TcpServer::TcpServer(const TcpServerOptions& options, RegionSource regions,
                     std::unique_ptr<Acceptor> acceptor)
    : options_(options),
      regions_(std::move(regions)),
      reads_(std::make_shared<TcpDeviceReadService>(options_.device)),
      acceptor_(std::move(acceptor)),
      io_(static_cast<size_t>(options_.io_threads)) {}

TcpServer::IoThread* TcpServer::io_for_next_connection() {
  std::unique_ptr<IoThread>& io = io_[next_io_++ % io_.size()];
  if (!io) {
    auto started = std::make_unique<IoThread>(options_, regions_, reads_);
    if (Status s = started->start(); !s.ok()) {
      start_failures_.warn("tcp receiver: {}; connection refused", s.message());
      return nullptr;
    }
    io = std::move(started);
  }
  return io.get();
}

TcpServer::~TcpServer() {
  acceptor_->stop();  // before the I/O threads go: the acceptor hands connections to them
  io_.clear();
}

const Endpoint& TcpServer::endpoint() const { return acceptor_->endpoint(); }

}  // namespace kvferry
