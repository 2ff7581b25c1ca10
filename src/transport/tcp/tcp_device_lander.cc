#include "transport/tcp/tcp_device_lander.h"

#include <fmt/format.h>

namespace kvferry {

Result<std::unique_ptr<TcpDeviceLander>> TcpDeviceLander::create(std::shared_ptr<CudaMemoryApi> api,
                                                                 uint64_t buffer_bytes,
                                                                 int device) {
  KVF_ASSIGN_OR_RETURN(void* buffer, api->alloc_pinned(buffer_bytes));
  Result<CudaStream> stream = api->create_stream(device);
  if (!stream.ok()) {
    api->free_pinned(buffer);
    return stream.status();
  }
  return std::unique_ptr<TcpDeviceLander>(
      new TcpDeviceLander(std::move(api), static_cast<char*>(buffer), buffer_bytes, *stream));
}

TcpDeviceLander::~TcpDeviceLander() {
  // Every land() waited for its copy: nothing is enqueued on the stream.
  api_->destroy_stream(stream_);
  api_->free_pinned(buffer_);
}

Status TcpDeviceLander::land(char* device_dst, uint64_t bytes, CudaEvent after) {
  if (bytes > bytes_) {
    return Internal(fmt::format("tcp lander: {} bytes staged in a {}-byte buffer", bytes, bytes_));
  }
  if (after != nullptr) KVF_RETURN_IF_ERROR(api_->stream_wait_event(stream_, after));
  KVF_RETURN_IF_ERROR(
      api_->copy_async(device_dst, buffer_, bytes, CudaCopyDirection::kHostToDevice, stream_));
  KVF_ASSIGN_OR_RETURN(CudaEvent done, api_->record_event(stream_));
  Status s = api_->wait_event(done);
  api_->destroy_event(done);
  if (!s.ok()) {
    return Internal(fmt::format("copying {} staged bytes to device memory at {}: {}", bytes,
                                static_cast<const void*>(device_dst), s.message()));
  }
  return s;
}

Result<TcpDeviceLander*> TcpLanderSet::for_device(int device) {
  if (auto it = landers_.find(device); it != landers_.end()) return it->second.get();
  if (!staging_ || !staging_->built()) {
    return NotSupported("this build has no CUDA: tcp cannot land bytes in device memory");
  }
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, staging_->api());
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<TcpDeviceLander> lander,
                       TcpDeviceLander::create(std::move(api), staging_->buffer_bytes(), device));
  return landers_.emplace(device, std::move(lander)).first->second.get();
}

}  // namespace kvferry
