// TcpDeviceLander: how the tcp receiver writes a request's payload into device memory. The
// payload is received into a pinned buffer of the lander's, then copied to the device with
// an asynchronous copy and an event; land() returns only once that copy completed, so the
// receiver acknowledges a request only when its bytes are in device memory.
//
// One lander per (receiver I/O thread, device): an I/O thread serves many connections but
// receives for one at a time, and it lands what it staged before it turns to another (at
// the latest when the socket runs dry), so one buffer per I/O thread suffices. The
// receiver's staging is bounded by design (I/O threads x devices touched x buffer bytes):
// it never waits for a buffer and never allocates per request.
//
// The initiator lands the payload of a READ into its device memory the same way, one lander
// per (lane, device), used by whoever holds the lane's reading role: TcpLanderSet below.
//
// Thread-safety: one thread at a time (an I/O thread, a lane's reading turn) uses a lander.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "kvferry/status.h"
#include "transport/cuda_memory_api.h"
#include "transport/tcp/tcp_staging_pool.h"

namespace kvferry {

class TcpDeviceLander {
 public:
  static Result<std::unique_ptr<TcpDeviceLander>> create(std::shared_ptr<CudaMemoryApi> api,
                                                         uint64_t buffer_bytes, int device);
  ~TcpDeviceLander();
  TcpDeviceLander(const TcpDeviceLander&) = delete;
  TcpDeviceLander& operator=(const TcpDeviceLander&) = delete;

  char* buffer() const { return buffer_; }
  uint64_t capacity() const { return bytes_; }
  // Copies the buffer's first `bytes` to `device_dst` and waits until the copy completed;
  // with `after`, the copy runs only after that event (SubmitOptions::after_cuda_event).
  Status land(char* device_dst, uint64_t bytes, CudaEvent after = nullptr);

 private:
  TcpDeviceLander(std::shared_ptr<CudaMemoryApi> api, char* buffer, uint64_t bytes,
                  CudaStream stream)
      : api_(std::move(api)), buffer_(buffer), bytes_(bytes), stream_(stream) {}

  std::shared_ptr<CudaMemoryApi> api_;
  char* buffer_;
  uint64_t bytes_;
  CudaStream stream_;
};

// One thread's landers, by device, created on first need from the transport's staging.
class TcpLanderSet {
 public:
  explicit TcpLanderSet(std::shared_ptr<TcpDeviceStaging> staging) : staging_(std::move(staging)) {}
  // NotSupported when this build cannot stage (no CUDA); the runtime's error when the lander
  // cannot be made.
  Result<TcpDeviceLander*> for_device(int device);

 private:
  std::shared_ptr<TcpDeviceStaging> staging_;
  std::unordered_map<int, std::unique_ptr<TcpDeviceLander>> landers_;
};

}  // namespace kvferry
