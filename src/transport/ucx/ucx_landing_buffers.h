// UcxLandingBuffers: the buffers a worker receives rendezvous payloads into (a write's at
// the target, a read reply's at the initiator) before they are copied to where they belong.
// Buffers are reused, in power-of-two size classes, so the steady state allocates nothing
// and UCX's registration cache keeps hitting the same addresses: a fresh allocation per
// payload cost about ten times the transfer (mmap, first-touch faults, and a registration
// cache invalidated by every munmap). At most `cached_bytes` are kept idle, and only while
// they are in use: once nothing was acquired for kIdleRelease, every idle buffer is freed
// (the worker calls release_if_idle), so an engine that stopped moving data gives it back.
//
// Thread-safety: none; used in the worker's turns only (one at a time). A Lease must be released
// (destroyed) before the pool is.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

namespace kvferry::detail {

// What one worker keeps idle at most: the active-message windows (kUcxAmWindowBytes) of a
// few jobs at once, so writes in flight from several threads reuse their buffers.
inline constexpr size_t kUcxLandingCacheBytes = size_t{256} << 20;

class UcxLandingBuffers {
 public:
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();
    char* data() const { return buffer_.get(); }

   private:
    friend class UcxLandingBuffers;
    UcxLandingBuffers* pool_ = nullptr;
    size_t size_class_ = 0;
    std::unique_ptr<char[]> buffer_;
  };

  // The smallest and largest buffers kept; larger requests get a buffer of their own.
  static constexpr size_t kMinBytes = size_t{64} << 10;
  static constexpr size_t kMaxBytes = size_t{8} << 20;

  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kIdleRelease{1};

  explicit UcxLandingBuffers(size_t cached_bytes) : cached_limit_(cached_bytes) {}
  // A buffer of at least `bytes` (uninitialised).
  Lease acquire(size_t bytes, Clock::time_point now = Clock::now());
  // Frees every idle buffer once nothing was acquired for kIdleRelease. Returns when it has
  // to be called again (max() when nothing is held idle).
  Clock::time_point release_if_idle(Clock::time_point now);
  // Bytes held idle for reuse.
  size_t cached_bytes() const { return cached_; }

 private:
  static constexpr size_t kClasses = 8;  // 64 KiB ... 8 MiB
  static_assert((kMinBytes << (kClasses - 1)) == kMaxBytes);
  void give_back(size_t size_class, std::unique_ptr<char[]> buffer);

  size_t cached_limit_;
  size_t cached_ = 0;
  Clock::time_point last_acquire_{};
  std::array<std::vector<std::unique_ptr<char[]>>, kClasses> idle_;
};

}  // namespace kvferry::detail
