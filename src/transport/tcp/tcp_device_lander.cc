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

Status TcpDeviceLander::land(char* device_dst, uint64_t bytes) {
  if (bytes > bytes_) {
    return Internal(fmt::format("tcp lander: {} bytes staged in a {}-byte buffer", bytes, bytes_));
  }
  KVF_RETURN_IF_ERROR(
      api_->copy_async(device_dst, buffer_, bytes, CudaCopyDirection::kHostToDevice, stream_));
  KVF_ASSIGN_OR_RETURN(CudaEvent done, api_->record_event(stream_));
  Status s = api_->wait_event(done);
  api_->destroy_event(done);
  return s;
}

}  // namespace kvferry
