// TcpStagingPool: the pinned host buffers through which one engine's tcp transport sends
// device memory (docs/TRANSPORTS.md, "tcp with device memory"). Bounded: at most
// `max_buffers` buffers of `buffer_bytes`, allocated on first need and kept until the pool
// goes. When every buffer is leased, acquire() waits for one to come back — until the
// caller's deadline or stop condition — and never allocates more.
//
// TcpDeviceStaging (below) is what the transport shares between its links and its
// receiver: the CUDA API, opened on first use (opening initialises CUDA), the links' pool
// (WRITEs from device memory), and the receiver's pool (answers to READs of device memory),
// each bounded on its own so neither side can starve the other.
//
// Ownership: a lease keeps its pool alive (shared_ptr). Thread-safety: every call is
// thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/net.h"
#include "kvferry/status.h"
#include "transport/cuda_memory_api.h"

namespace kvferry {

class TcpStagingPool;

// One leased buffer; returned to its pool when the lease ends. Move-only.
class StagingLease {
 public:
  StagingLease() = default;
  StagingLease(std::shared_ptr<TcpStagingPool> pool, char* data, uint64_t bytes)
      : pool_(std::move(pool)), data_(data), bytes_(bytes) {}
  StagingLease(StagingLease&& o) noexcept { *this = std::move(o); }
  StagingLease& operator=(StagingLease&& o) noexcept;
  StagingLease(const StagingLease&) = delete;
  StagingLease& operator=(const StagingLease&) = delete;
  ~StagingLease() { release(); }

  char* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  explicit operator bool() const { return data_ != nullptr; }
  void release();

 private:
  std::shared_ptr<TcpStagingPool> pool_;
  char* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class TcpStagingPool : public std::enable_shared_from_this<TcpStagingPool> {
 public:
  // InvalidArgument naming the value when buffer_bytes or max_buffers is out of range.
  static Result<std::shared_ptr<TcpStagingPool>> create(std::shared_ptr<CudaMemoryApi> api,
                                                        uint64_t buffer_bytes, int max_buffers);
  ~TcpStagingPool();
  TcpStagingPool(const TcpStagingPool&) = delete;
  TcpStagingPool& operator=(const TcpStagingPool&) = delete;

  // A free buffer, waiting while all are leased. `stop` is asked before waiting and on
  // every wake-up (at least every kStagingRecheck): a non-OK answer (the batch was
  // cancelled, its peer died) ends the wait with it; so does `deadline` (Timeout). An
  // allocation failure of the runtime is returned as is.
  Result<StagingLease> acquire(Clock::time_point deadline, const std::function<Status()>& stop);

  uint64_t buffer_bytes() const { return buffer_bytes_; }
  int max_buffers() const { return max_buffers_; }
  int buffers_allocated() const;
  // How many acquire() calls found every buffer leased and had to wait (for tests and logs).
  uint64_t waits() const;

 private:
  friend class StagingLease;
  TcpStagingPool(std::shared_ptr<CudaMemoryApi> api, uint64_t buffer_bytes, int max_buffers)
      : api_(std::move(api)), buffer_bytes_(buffer_bytes), max_buffers_(max_buffers) {}
  void give_back(char* data);

  std::shared_ptr<CudaMemoryApi> api_;
  const uint64_t buffer_bytes_;
  const int max_buffers_;
  mutable std::mutex mu_;
  std::condition_variable returned_;
  std::vector<char*> all_;   // guarded by mu_
  std::vector<char*> free_;  // guarded by mu_
  uint64_t waits_ = 0;       // guarded by mu_
};

inline constexpr std::chrono::milliseconds kStagingRecheck{20};
inline constexpr uint64_t kMinStagingBufferBytes = uint64_t{64} << 10;
inline constexpr uint64_t kMaxStagingBufferBytes = uint64_t{64} << 20;
inline constexpr int kMaxStagingBuffers = 1024;
inline constexpr uint64_t kDefaultStagingBufferBytes = uint64_t{4} << 20;
inline constexpr int kDefaultStagingBuffers = 8;

// What the tcp transport's links and receiver share for device memory.
class TcpDeviceStaging {
 public:
  TcpDeviceStaging(CudaMemoryApiOpener opener, uint64_t buffer_bytes, int max_buffers)
      : opener_(std::move(opener)), buffer_bytes_(buffer_bytes), max_buffers_(max_buffers) {}

  // Whether this build can stage at all (an opener exists); asking opens nothing.
  bool built() const { return static_cast<bool>(opener_); }
  // The API, opened on the first call (later calls return the same one, or the same error).
  Result<std::shared_ptr<CudaMemoryApi>> api();
  // The links' pool, created with the API on first call.
  Result<std::shared_ptr<TcpStagingPool>> pool();
  // The receiver's pool for READ answers (same bounds), created on first call.
  Result<std::shared_ptr<TcpStagingPool>> serve_pool();
  uint64_t buffer_bytes() const { return buffer_bytes_; }
  int max_buffers() const { return max_buffers_; }

 private:
  Status open_locked();

  CudaMemoryApiOpener opener_;
  const uint64_t buffer_bytes_;
  const int max_buffers_;
  std::mutex mu_;
  bool tried_ = false;                          // guarded by mu_
  Status open_status_;                          // guarded by mu_
  std::shared_ptr<CudaMemoryApi> api_;          // guarded by mu_
  std::shared_ptr<TcpStagingPool> pool_;        // guarded by mu_
  std::shared_ptr<TcpStagingPool> serve_pool_;  // guarded by mu_
};

}  // namespace kvferry
