#include "core/acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

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

}  // namespace

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
      options_(std::move(options)) {
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
      on_connection_(Fd(conn));
      continue;
    }
    const int error = errno;
    if (retry_at_once(error)) continue;
    if (!back_off(error)) return;
  }
}

}  // namespace kvferry
