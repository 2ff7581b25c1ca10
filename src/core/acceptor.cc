#include "core/acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/logging.h"

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

}  // namespace

// Open connections of one listener, in total and per source; shared by the acceptor and
// the slots it handed out (which may outlive it).
struct ConnectionCounts {
  std::mutex mu;
  uint32_t total = 0;                                   // guarded by mu
  std::unordered_map<std::string, uint32_t> by_source;  // guarded by mu
};

ConnectionSlot::ConnectionSlot(std::shared_ptr<ConnectionCounts> counts, std::string source)
    : counts_(std::move(counts)), source_(std::move(source)) {}

ConnectionSlot& ConnectionSlot::operator=(ConnectionSlot&& other) noexcept {
  if (this != &other) {
    release();
    counts_ = std::move(other.counts_);
    source_ = std::move(other.source_);
  }
  return *this;
}

void ConnectionSlot::release() {
  if (counts_ == nullptr) return;
  {
    std::lock_guard lock(counts_->mu);
    --counts_->total;
    auto it = counts_->by_source.find(source_);
    if (it != counts_->by_source.end() && --it->second == 0) counts_->by_source.erase(it);
  }
  counts_.reset();
}

Result<std::unique_ptr<Acceptor>> Acceptor::bind(const Endpoint& endpoint, Options options) {
  Endpoint bound;
  KVF_ASSIGN_OR_RETURN(Fd listener, listen_tcp(endpoint, &bound));
  Fd wake(::eventfd(0, EFD_CLOEXEC));
  if (!wake.valid()) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
  return std::unique_ptr<Acceptor>(
      new Acceptor(std::move(listener), std::move(wake), std::move(bound), std::move(options)));
}

Acceptor::Acceptor(Fd listener, Fd wake, Endpoint bound, Options options)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      bound_(std::move(bound)),
      options_(std::move(options)),
      counts_(std::make_shared<ConnectionCounts>()) {
  if (!options_.accept_call) {
    options_.accept_call = [](int fd, int flags) { return ::accept4(fd, nullptr, nullptr, flags); };
  }
}

Acceptor::~Acceptor() { stop(); }

void Acceptor::start(OnConnection on_connection) {
  on_connection_ = std::move(on_connection);
  thread_ = std::thread([this] { accept_loop(); });
}

void Acceptor::stop() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool Acceptor::back_off(int error) {
  backoffs_.fetch_add(1);
  if (!backing_off_) {  // once per episode: it may last, and the log must not flood
    backing_off_ = true;
    log().warn("{}: accept on {} failed: {}; pausing {} ms between attempts", options_.name,
               bound_.to_string(), std::strerror(error), options_.backoff.count());
  }
  pollfd wake{wake_.get(), POLLIN, 0};
  return ::poll(&wake, 1, static_cast<int>(options_.backoff.count())) <= 0 ||
         (wake.revents & POLLIN) == 0;
}

uint32_t Acceptor::open_connections() const {
  std::lock_guard lock(counts_->mu);
  return counts_->total;
}

bool Acceptor::take_slot(const std::string& source, ConnectionSlot& slot) {
  const ListenerLimits& limits = options_.limits;
  std::lock_guard lock(counts_->mu);
  uint32_t& from_source = counts_->by_source[source];
  const bool over_total = limits.max_connections != 0 && counts_->total >= limits.max_connections;
  const bool over_source =
      limits.max_connections_per_source != 0 && from_source >= limits.max_connections_per_source;
  if (over_total || over_source) {
    if (from_source == 0) counts_->by_source.erase(source);
    if (!refusing_) {  // once per episode, like the back-off
      refusing_ = true;
      log().warn(
          "{}: refusing connections on {}: {} open, {} from {} (limits {} and {} per source)",
          options_.name, bound_.to_string(), counts_->total, from_source,
          source.empty() ? "an unknown source" : source, limits.max_connections,
          limits.max_connections_per_source);
    }
    return false;
  }
  ++counts_->total;
  ++from_source;
  refusing_ = false;
  slot = ConnectionSlot(counts_, source);
  return true;
}

void Acceptor::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 || (fds[1].revents & POLLIN) != 0) return;
    int conn = options_.accept_call(listener_.get(), options_.flags | SOCK_CLOEXEC);
    if (conn >= 0) {
      if (backing_off_) log().info("{}: accepting again", options_.name);
      backing_off_ = false;
      Fd connection(conn);
      ConnectionSlot slot;
      if (!take_slot(source_address(conn), slot)) {
        refused_.fetch_add(1);
        continue;  // closed here: over a limit
      }
      on_connection_(std::move(connection), std::move(slot));
      continue;
    }
    const int error = errno;
    if (retry_at_once(error)) continue;
    if (!back_off(error)) return;
  }
}

}  // namespace kvferry
