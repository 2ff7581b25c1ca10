#include "engine/peer_monitor.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/logging.h"
#include "core/named_thread.h"

namespace kvferry::detail {
namespace {
constexpr uint64_t kWakeKey = 0;
}

PeerMonitor::PeerMonitor()
    : epoll_(::epoll_create1(EPOLL_CLOEXEC)), wake_(::eventfd(0, EFD_CLOEXEC)) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeKey;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev);
}

PeerMonitor::~PeerMonitor() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

Status PeerMonitor::watch(const std::shared_ptr<PeerState>& peer) {
  Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(peer->pid), 0)));
  if (!pidfd.valid()) {
    const int err = errno;
    if (err == ESRCH) {
      return PeerDisconnected("peer " + peer->name + " (pid " + std::to_string(peer->pid) +
                              ") has exited");
    }
    if (err == ENOSYS || err == EPERM) {
      std::lock_guard lock(mu_);
      if (!std::exchange(said_unwatched_, true)) {
        log().warn(
            "same-host peers' deaths are seen through their connections only: this "
            "process may not use pidfd_open ({})",
            std::strerror(err));
      }
      return Status::Ok();
    }
    return ErrnoStatus(StatusCode::kInternal, "pidfd_open for peer " + peer->name, err);
  }
  std::lock_guard lock(mu_);
  // Peers nobody holds any more (closed, replaced) need no watching: drop their pidfds so
  // a long-lived engine that reopens peers does not accumulate them.
  for (auto it = watched_.begin(); it != watched_.end();) {
    if (it->second.peer.expired()) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
      it = watched_.erase(it);
    } else {
      ++it;
    }
  }
  if (!thread_.joinable()) {
    KVF_ASSIGN_OR_RETURN(thread_, start_named_thread("kvf-peer-mon", [this] { loop(); }));
  }
  uint64_t key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = key;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pidfd.get(), &ev) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "epoll_ctl", errno);
  }
  watched_.emplace(key, Watched{std::move(pidfd), peer});
  return Status::Ok();
}

void PeerMonitor::loop() {
  constexpr int kMaxEvents = 16;
  epoll_event events[kMaxEvents];
  for (;;) {
    int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return;
    for (int i = 0; i < n; ++i) {
      uint64_t key = events[i].data.u64;
      if (key == kWakeKey) return;
      std::lock_guard lock(mu_);
      auto it = watched_.find(key);
      if (it == watched_.end()) continue;
      if (auto peer = it->second.peer.lock()) {
        log().warn("peer {} (pid {}) exited; failing its batches", peer->name, peer->pid);
        peer->mark_disconnected("process " + std::to_string(peer->pid) + " exited");
      }
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.pidfd.get(), nullptr);
      watched_.erase(it);
    }
  }
}

}  // namespace kvferry::detail
