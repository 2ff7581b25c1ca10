// PeerLiveness: whether a peer is still usable, and why not. Shared by the engine's peer
// state, the transports' links and the batches to the peer (which must not own the peer's
// state: a link's threads would then end up destroying themselves).
//
// Thread-safety: all methods may be called concurrently; the first mark wins.
#pragma once

#include <atomic>
#include <mutex>
#include <string>

namespace kvferry {

class PeerLiveness {
 public:
  explicit PeerLiveness(std::string name) : name_(std::move(name)) {}
  const std::string& name() const { return name_; }
  bool is_disconnected() const { return disconnected_.load(std::memory_order_acquire); }
  void mark_disconnected(std::string reason) {
    std::lock_guard lock(reason_mu_);
    if (disconnected_.load()) return;
    reason_ = std::move(reason);
    disconnected_.store(true, std::memory_order_release);
  }
  std::string disconnect_reason() const {
    std::lock_guard lock(reason_mu_);
    return reason_;
  }

 private:
  std::string name_;
  std::atomic<bool> disconnected_{false};
  mutable std::mutex reason_mu_;
  std::string reason_;
};

}  // namespace kvferry
