#include "transport/ucx/ucx_landing_buffers.h"

#include <bit>
#include <utility>

namespace kvferry::detail {

UcxLandingBuffers::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      size_class_(other.size_class_),
      buffer_(std::move(other.buffer_)) {}

UcxLandingBuffers::Lease& UcxLandingBuffers::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Lease old(std::move(*this));
    pool_ = std::exchange(other.pool_, nullptr);
    size_class_ = other.size_class_;
    buffer_ = std::move(other.buffer_);
  }
  return *this;
}

UcxLandingBuffers::Lease::~Lease() {
  if (pool_ != nullptr && buffer_ != nullptr) pool_->give_back(size_class_, std::move(buffer_));
}

UcxLandingBuffers::Lease UcxLandingBuffers::acquire(size_t bytes, Clock::time_point now) {
  last_acquire_ = now;
  Lease lease;
  if (bytes > kMaxBytes) {  // not pooled
    lease.buffer_ = std::make_unique_for_overwrite<char[]>(bytes);
    return lease;
  }
  const size_t rounded = std::bit_ceil(bytes < kMinBytes ? kMinBytes : bytes);
  const auto size_class = static_cast<size_t>(std::countr_zero(rounded / kMinBytes));
  lease.pool_ = this;
  lease.size_class_ = size_class;
  std::vector<std::unique_ptr<char[]>>& idle = idle_[size_class];
  if (!idle.empty()) {
    lease.buffer_ = std::move(idle.back());
    idle.pop_back();
    cached_ -= rounded;
  } else {
    lease.buffer_ = std::make_unique_for_overwrite<char[]>(rounded);
  }
  return lease;
}

UcxLandingBuffers::Clock::time_point UcxLandingBuffers::release_if_idle(Clock::time_point now) {
  if (cached_ == 0) return Clock::time_point::max();
  if (now - last_acquire_ < kIdleRelease) return last_acquire_ + kIdleRelease;
  for (auto& idle : idle_) idle.clear();
  cached_ = 0;
  return Clock::time_point::max();
}

void UcxLandingBuffers::give_back(size_t size_class, std::unique_ptr<char[]> buffer) {
  const size_t bytes = kMinBytes << size_class;
  if (cached_ + bytes > cached_limit_) return;  // freed
  idle_[size_class].push_back(std::move(buffer));
  cached_ += bytes;
}

}  // namespace kvferry::detail
