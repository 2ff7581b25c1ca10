// SharedSnapshot<T>: an immutable value that readers take a reference to (load) while a
// writer replaces it (store): the engine's region table, its published descriptor, a peer's
// segment. What std::atomic<std::shared_ptr<const T>> offers, and not that type: libstdc++
// 12's load() releases its internal lock with a relaxed write, so a later store's pointer swap
// is not ordered after the load's read, and ThreadSanitizer reports the pair as a data race
// (an engine that republished its descriptor while its handshake server read it). That lock
// is a spin lock; uncontended, this mutex costs about the same.
//
// Thread-safety: load() and store() may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <utility>

namespace kvferry {

template <typename T>
class SharedSnapshot {
 public:
  std::shared_ptr<const T> load() const {
    std::lock_guard lock(mu_);
    return value_;
  }

  void store(std::shared_ptr<const T> value) {
    std::shared_ptr<const T> replaced;  // freed outside the lock
    std::lock_guard lock(mu_);
    replaced = std::exchange(value_, std::move(value));
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const T> value_;
};

}  // namespace kvferry
