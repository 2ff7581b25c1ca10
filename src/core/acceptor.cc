#include "core/acceptor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/logging.h"
#include "core/named_thread.h"

namespace kvferry {
namespace {

// Errors that concern the one connection being accepted (it was reset before we took it,
// or a network error Linux passes on through accept): the next one may well succeed.
bool retry_at_once(int error) {
  switch (error) {
    case EINTR:
    case EAGAIN:
#if EWOULDBLOCK != EAGAIN
    case EWOULDBLOCK:
#endif
    case ECONNABORTED:
    case EPROTO:
    case ENETDOWN:
    case ENOPROTOOPT:
    case EHOSTDOWN:
    case ENONET:
    case EHOSTUNREACH:
    case EOPNOTSUPP:
    case ENETUNREACH: return true;
    default: return false;
  }
}

// The client's IP literal; "" when the socket has no peer address we understand.
std::string source_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return {};
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw = nullptr;
  if (addr.ss_family == AF_INET) raw = &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr;
  if (addr.ss_family == AF_INET6) raw = &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
  if (raw == nullptr || ::inet_ntop(addr.ss_family, raw, text, sizeof(text)) == nullptr) return {};
  return text;
}

// How many of a source's oldest evictable connections are passed over because request bytes
// have arrived on them that their owner has not read yet (a peer about to be served).
constexpr int kMaxVictimsPassedOver = 4;
// Connections accepted per wake-up of the accept thread, before it polls again.
constexpr int kAcceptBurst = 64;
// The listen queue asked for (the kernel caps it at net.core.somaxconn): a flood fills a
// short queue between two wake-ups, and a peer's connection then waits for a SYN retry.
constexpr int kAcceptBacklog = 4096;

// Whether bytes wait unread on the connection.
bool has_unread_bytes(int fd) {
  int pending = 0;
  return ::ioctl(fd, FIONREAD, &pending) == 0 && pending > 0;
}

}  // namespace

// One slot's state, shared by the slot and its listener's counts; guarded by
// ConnectionCounts::mu except `fd` and `source`, which never change.
struct SlotState {
  SlotState(int connection, std::string from) : fd(connection), source(std::move(from)) {}
  const int fd;
  const std::string source;
  bool evictable = false;  // in its source's evictable list, at `position`
  bool evicted = false;    // counted in ConnectionCounts::closing, no longer in total
  std::list<SlotState*>::iterator position;
};

// What one source holds.
struct SourceCounts {
  uint32_t open = 0;
  std::list<SlotState*> evictable;  // oldest first
};

// Open connections of one listener, in total and per source; shared by the acceptor and
// the slots it handed out (which may outlive it).
struct ConnectionCounts {
  std::mutex mu;
  uint32_t total = 0;                                       // guarded by mu
  uint32_t closing = 0;                                     // guarded by mu: evicted, still open
  std::unordered_map<std::string, SourceCounts> by_source;  // guarded by mu
};

ConnectionSlot::ConnectionSlot(std::shared_ptr<ConnectionCounts> counts,
                               std::shared_ptr<SlotState> state)
    : counts_(std::move(counts)), state_(std::move(state)) {}

ConnectionSlot::~ConnectionSlot() { release(); }

ConnectionSlot& ConnectionSlot::operator=(ConnectionSlot&& other) noexcept {
  if (this != &other) {
    release();
    counts_ = std::move(other.counts_);
    state_ = std::move(other.state_);
  }
  return *this;
}

const std::string& ConnectionSlot::source() const {
  static const std::string kUnknown;
  return state_ == nullptr ? kUnknown : state_->source;
}

bool ConnectionSlot::evicted() const {
  if (counts_ == nullptr) return false;
  std::lock_guard lock(counts_->mu);
  return state_->evicted;
}

bool ConnectionSlot::mark_engaged() {
  if (counts_ == nullptr) return true;
  std::lock_guard lock(counts_->mu);
  if (state_->evicted) return false;
  if (state_->evictable) {
    counts_->by_source[state_->source].evictable.erase(state_->position);
    state_->evictable = false;
  }
  return true;
}

void ConnectionSlot::release() {
  if (counts_ == nullptr) return;
  {
    std::lock_guard lock(counts_->mu);
    if (state_->evicted) {
      --counts_->closing;
    } else {
      --counts_->total;
      auto it = counts_->by_source.find(state_->source);
      if (it != counts_->by_source.end()) {
        if (state_->evictable) it->second.evictable.erase(state_->position);
        if (--it->second.open == 0) counts_->by_source.erase(it);
      }
    }
  }
  counts_.reset();
  state_.reset();
}

// The process's accept thread: it polls the listening socket of every started Acceptor
// (those backing off excepted, until their pause ends) and runs the ready one's accept_ready.
// One thread for all listeners, not one each: every callback only queues or adopts its
// connection, so none holds up the others. The thread starts with the first listener and
// ends when the last one stops.
class AcceptHub {
 public:
  static AcceptHub& instance() {
    static AcceptHub* hub = new AcceptHub();  // never destroyed: stop() may run at exit
    return *hub;
  }

  Status add(Acceptor* a) {
    std::lock_guard lock(mu_);
    if (!running_thread_) {
      KVF_ASSIGN_OR_RETURN(std::thread thread, start_named_thread("kvf-accept", [this] { run(); }));
      thread.detach();
      running_thread_ = true;
    }
    members_.push_back({a, {}});
    wake();
    return Status::Ok();
  }

  // After it returns, a's accept_ready never runs again (on the hub's own thread, from a's
  // callback, it returns at once: the call under way is the caller's).
  void remove(Acceptor* a) {
    std::unique_lock lock(mu_);
    std::erase_if(members_, [a](const Member& m) { return m.acceptor == a; });
    if (std::this_thread::get_id() == thread_id_) return;
    idle_.wait(lock, [&] { return serving_ != a; });
    wake();
  }

 private:
  struct Member {
    Acceptor* acceptor;
    Clock::time_point paused_until;  // backing off until then
  };

  AcceptHub() : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

  void wake() {  // mu_ held
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void run() {
    std::vector<pollfd> fds;
    std::vector<Acceptor*> polled;
    std::unique_lock lock(mu_);
    thread_id_ = std::this_thread::get_id();
    for (;;) {
      if (members_.empty()) {
        running_thread_ = false;
        thread_id_ = {};
        return;
      }
      fds.assign(1, pollfd{wake_.get(), POLLIN, 0});
      polled.clear();
      const Clock::time_point now = Clock::now();
      Clock::time_point next_resume = Clock::time_point::max();
      for (const Member& m : members_) {
        if (m.paused_until > now) {
          next_resume = std::min(next_resume, m.paused_until);
          continue;
        }
        fds.push_back(pollfd{m.acceptor->listener_.get(), POLLIN, 0});
        polled.push_back(m.acceptor);
      }
      int timeout = -1;
      if (next_resume != Clock::time_point::max()) {
        timeout = static_cast<int>(
            std::chrono::ceil<std::chrono::milliseconds>(next_resume - now).count());
      }
      lock.unlock();
      const int rc = ::poll(fds.data(), fds.size(), timeout);
      if (rc > 0 && (fds[0].revents & POLLIN) != 0) {
        uint64_t drained = 0;
        [[maybe_unused]] ssize_t n = ::read(wake_.get(), &drained, sizeof(drained));
      }
      lock.lock();
      if (rc <= 0) continue;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        Acceptor* a = polled[i - 1];
        auto member = std::find_if(members_.begin(), members_.end(),
                                   [a](const Member& m) { return m.acceptor == a; });
        if (member == members_.end()) continue;  // stopped meanwhile
        serving_ = a;
        lock.unlock();
        const std::optional<Clock::time_point> pause = a->accept_ready();
        lock.lock();
        serving_ = nullptr;
        idle_.notify_all();
        if (!pause) continue;
        member = std::find_if(members_.begin(), members_.end(),
                              [a](const Member& m) { return m.acceptor == a; });
        if (member != members_.end()) member->paused_until = *pause;
      }
    }
  }

  std::mutex mu_;
  std::condition_variable idle_;  // serving_ changed
  std::vector<Member> members_;   // guarded by mu_
  Acceptor* serving_ = nullptr;   // whose accept_ready runs now; guarded by mu_
  bool running_thread_ = false;   // guarded by mu_
  std::thread::id thread_id_;     // the running thread's; guarded by mu_
  Fd wake_;                       // eventfd: the member list changed
};

Result<std::unique_ptr<Acceptor>> Acceptor::bind(const Endpoint& endpoint, Options options) {
  Endpoint bound;
  KVF_ASSIGN_OR_RETURN(Fd listener, listen_tcp(endpoint, &bound));
  // A longer queue than listen_tcp's, so that one wake-up drains a burst.
  if (::listen(listener.get(), kAcceptBacklog) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "listen", errno);
  }
  std::string where = bound.to_string();
  return adopt_as(std::move(listener), std::move(bound), std::move(where), std::move(options));
}

Result<std::unique_ptr<Acceptor>> Acceptor::adopt(Fd listener, std::string where, Options options) {
  return adopt_as(std::move(listener), Endpoint{}, std::move(where), std::move(options));
}

Result<std::unique_ptr<Acceptor>> Acceptor::adopt_as(Fd listener, Endpoint bound, std::string where,
                                                     Options options) {
  // Non-blocking, so that accept_ready ends when the queue is empty.
  const int flags = ::fcntl(listener.get(), F_GETFL);
  if (flags < 0 || ::fcntl(listener.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "fcntl(O_NONBLOCK) on the listener", errno);
  }
  return std::unique_ptr<Acceptor>(
      new Acceptor(std::move(listener), std::move(bound), std::move(where), std::move(options)));
}

Acceptor::Acceptor(Fd listener, Endpoint bound, std::string where, Options options)
    : listener_(std::move(listener)),
      bound_(std::move(bound)),
      where_(std::move(where)),
      options_(std::move(options)),
      counts_(std::make_shared<ConnectionCounts>()) {
  if (!options_.accept_call) {
    options_.accept_call = [](int fd, int flags) { return ::accept4(fd, nullptr, nullptr, flags); };
  }
}

Acceptor::~Acceptor() { stop(); }

Status Acceptor::start(OnConnection on_connection) {
  on_connection_ = std::move(on_connection);
  return AcceptHub::instance().add(this);
}

void Acceptor::stop() {
  stopped_.store(true);  // ends a burst under way (stop() called from the callback)
  AcceptHub::instance().remove(this);
}

Clock::time_point Acceptor::back_off(int error) {
  backoffs_.fetch_add(1);
  if (!backing_off_) {  // once per episode: it may last, and the log must not flood
    backing_off_ = true;
    log().warn("{}: accept on {} failed: {}; pausing {} ms between attempts", options_.name, where_,
               std::strerror(error), options_.backoff.count());
  }
  return Clock::now() + options_.backoff;
}

uint32_t Acceptor::open_connections() const {
  std::lock_guard lock(counts_->mu);
  return counts_->total;
}

SlotState* Acceptor::choose_victim_locked(const std::string& source, bool over_source) const {
  const ListenerLimits& limits = options_.limits;
  // Evicted sockets stay open until their owner sees them end, which under a flood lags:
  // bound how many may wait. Past the first bound only a source holding less than an even
  // share of the listener still gets in (a peer, not the flood), up to twice the bound.
  const uint32_t max_closing =
      limits.max_connections != 0 ? limits.max_connections : limits.max_connections_per_source;
  if (counts_->closing >= 2 * max_closing) return nullptr;
  if (counts_->closing >= max_closing) {
    const auto sources = static_cast<uint32_t>(std::max<size_t>(1, counts_->by_source.size()));
    if (over_source || counts_->by_source.at(source).open >= max_closing / sources) return nullptr;
  }
  const SourceCounts* from = nullptr;
  if (over_source) {
    from = &counts_->by_source.at(source);
  } else {
    for (const auto& [address, held] : counts_->by_source) {
      if (held.evictable.empty()) continue;
      if (from == nullptr || held.open > from->open) from = &held;
    }
  }
  if (from == nullptr || from->evictable.empty()) return nullptr;
  int passed_over = 0;
  for (SlotState* candidate : from->evictable) {
    if (passed_over == kMaxVictimsPassedOver || !has_unread_bytes(candidate->fd)) return candidate;
    ++passed_over;
  }
  return from->evictable.front();
}

void Acceptor::evict_locked(SlotState& victim, const std::string& admitting) {
  auto it = counts_->by_source.find(victim.source);
  it->second.evictable.erase(victim.position);
  victim.evictable = false;
  victim.evicted = true;
  --counts_->total;
  ++counts_->closing;
  // The entry of the source being admitted is in use by the caller; it gains a connection.
  if (--it->second.open == 0 && victim.source != admitting) counts_->by_source.erase(it);
  // The owner sees the connection end and closes it; its place is free from now on.
  ::shutdown(victim.fd, SHUT_RDWR);
  evicted_.fetch_add(1);
  evictions_log_.warn(
      "{}: listener {} is full ({} connections, {} per source): closing the oldest connections "
      "that have not sent a request, from the sources holding the most, to admit new ones",
      options_.name, where_, options_.limits.max_connections,
      options_.limits.max_connections_per_source);
}

bool Acceptor::take_slot(int fd, const std::string& source, ConnectionSlot& slot) {
  const ListenerLimits& limits = options_.limits;
  std::lock_guard lock(counts_->mu);
  SourceCounts& from_source = counts_->by_source[source];
  for (;;) {
    const bool over_total = limits.max_connections != 0 && counts_->total >= limits.max_connections;
    const bool over_source = limits.max_connections_per_source != 0 &&
                             from_source.open >= limits.max_connections_per_source;
    if (!over_total && !over_source) break;
    SlotState* victim = options_.evict_idle ? choose_victim_locked(source, over_source) : nullptr;
    if (victim != nullptr) {
      evict_locked(*victim, source);
      continue;
    }
    const uint32_t held = from_source.open;
    if (held == 0) counts_->by_source.erase(source);
    refusals_log_.warn(
        "{}: refusing connections on {}: {} open, {} from {} (limits {} and {} per source)",
        options_.name, where_, counts_->total, held, source.empty() ? "an unknown source" : source,
        limits.max_connections, limits.max_connections_per_source);
    return false;
  }
  ++counts_->total;
  ++from_source.open;
  auto state = std::make_shared<SlotState>(fd, source);
  if (options_.evict_idle) {
    state->evictable = true;
    state->position = from_source.evictable.insert(from_source.evictable.end(), state.get());
  }
  slot = ConnectionSlot(counts_, std::move(state));
  return true;
}

std::optional<Clock::time_point> Acceptor::accept_ready() {
  for (int accepted = 0; accepted < kAcceptBurst && !stopped_.load(); ++accepted) {
    int conn = options_.accept_call(listener_.get(), options_.flags | SOCK_CLOEXEC);
    if (conn >= 0) {
      if (backing_off_) log().info("{}: accepting again", options_.name);
      backing_off_ = false;
      Fd connection(conn);
      // Every kvferry listener speaks request and reply in small frames: without
      // TCP_NODELAY, a second frame written before the first is acknowledged waits for
      // the peer's delayed ACK (about 40 ms on Linux).
      int one = 1;
      ::setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ConnectionSlot slot;
      if (!take_slot(conn, source_address(conn), slot)) {
        refused_.fetch_add(1);
        continue;  // closed here: over a limit
      }
      on_connection_(std::move(connection), std::move(slot));
      continue;
    }
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK) break;  // the queue is empty
    if (retry_at_once(error)) continue;
    return back_off(error);
  }
  return std::nullopt;
}

}  // namespace kvferry
