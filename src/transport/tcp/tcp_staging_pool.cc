#include "transport/tcp/tcp_staging_pool.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace kvferry {

StagingLease& StagingLease::operator=(StagingLease&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = std::move(o.pool_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void StagingLease::release() {
  if (pool_ && data_ != nullptr) pool_->give_back(data_);
  data_ = nullptr;
  bytes_ = 0;
  pool_.reset();
}

Result<std::shared_ptr<TcpStagingPool>> TcpStagingPool::create(std::shared_ptr<CudaMemoryApi> api,
                                                               uint64_t buffer_bytes,
                                                               int max_buffers) {
  if (buffer_bytes < kMinStagingBufferBytes || buffer_bytes > kMaxStagingBufferBytes) {
    return InvalidArgument(fmt::format("tcp_staging_buffer_bytes {} out of range {}..{}",
                                       buffer_bytes, kMinStagingBufferBytes,
                                       kMaxStagingBufferBytes));
  }
  if (max_buffers < 1 || max_buffers > kMaxStagingBuffers) {
    return InvalidArgument(
        fmt::format("tcp_staging_buffers {} out of range 1..{}", max_buffers, kMaxStagingBuffers));
  }
  if (!api) return InvalidArgument("tcp staging pool needs a CUDA API");
  return std::shared_ptr<TcpStagingPool>(
      new TcpStagingPool(std::move(api), buffer_bytes, max_buffers));
}

TcpStagingPool::~TcpStagingPool() {
  // Every lease holds the pool: none is outstanding now.
  for (char* b : all_) api_->free_pinned(b);
}

Result<StagingLease> TcpStagingPool::acquire(Clock::time_point deadline,
                                             const std::function<Status()>& stop) {
  std::unique_lock lock(mu_);
  bool counted = false;
  for (;;) {
    if (Status why = stop ? stop() : Status::Ok(); !why.ok()) return why;
    if (!free_.empty()) {
      char* b = free_.back();
      free_.pop_back();
      return StagingLease(shared_from_this(), b, buffer_bytes_);
    }
    if (static_cast<int>(all_.size()) < max_buffers_) {
      // Counted before the (slow) allocation, made outside the lock, so two threads never
      // allocate past the bound.
      all_.push_back(nullptr);
      lock.unlock();
      Result<void*> fresh = api_->alloc_pinned(buffer_bytes_);
      lock.lock();
      auto slot = std::find(all_.begin(), all_.end(), nullptr);
      if (!fresh.ok()) {
        all_.erase(slot);
        returned_.notify_one();  // another waiter may try again
        return fresh.status();
      }
      *slot = static_cast<char*>(*fresh);
      return StagingLease(shared_from_this(), *slot, buffer_bytes_);
    }
    if (!counted) {
      ++waits_;
      counted = true;
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      return Timeout(
          fmt::format("no tcp staging buffer came free before the batch deadline "
                      "(all {} of {} bytes in use)",
                      max_buffers_, buffer_bytes_));
    }
    returned_.wait_until(lock, std::min(deadline, now + kStagingRecheck));
  }
}

void TcpStagingPool::give_back(char* data) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(data);
  }
  returned_.notify_one();
}

int TcpStagingPool::buffers_allocated() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(std::count_if(all_.begin(), all_.end(), [](char* b) { return b; }));
}

uint64_t TcpStagingPool::waits() const {
  std::lock_guard lock(mu_);
  return waits_;
}

Status TcpDeviceStaging::open_locked() {
  if (tried_) return open_status_;
  tried_ = true;
  if (!opener_) {
    open_status_ = NotSupported("this build has no CUDA: tcp cannot stage device memory");
    return open_status_;
  }
  Result<std::shared_ptr<CudaMemoryApi>> api = opener_();
  if (!api.ok()) {
    open_status_ = api.status();
    return open_status_;
  }
  Result<std::shared_ptr<TcpStagingPool>> pool =
      TcpStagingPool::create(*api, buffer_bytes_, max_buffers_);
  if (!pool.ok()) {
    open_status_ = pool.status();
    return open_status_;
  }
  api_ = std::move(*api);
  pool_ = std::move(*pool);
  return open_status_;
}

Result<std::shared_ptr<CudaMemoryApi>> TcpDeviceStaging::api() {
  std::lock_guard lock(mu_);
  KVF_RETURN_IF_ERROR(open_locked());
  return api_;
}

Result<std::shared_ptr<TcpStagingPool>> TcpDeviceStaging::pool() {
  std::lock_guard lock(mu_);
  KVF_RETURN_IF_ERROR(open_locked());
  return pool_;
}

Result<std::shared_ptr<TcpStagingPool>> TcpDeviceStaging::serve_pool() {
  std::lock_guard lock(mu_);
  KVF_RETURN_IF_ERROR(open_locked());
  if (!serve_pool_) {
    KVF_ASSIGN_OR_RETURN(serve_pool_, TcpStagingPool::create(api_, buffer_bytes_, max_buffers_));
  }
  return serve_pool_;
}

}  // namespace kvferry
