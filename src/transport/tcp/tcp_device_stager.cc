#include "transport/tcp/tcp_device_stager.h"

#include <fmt/format.h>

#include "core/named_thread.h"

namespace kvferry {

TcpDeviceStager::TcpDeviceStager(std::shared_ptr<CudaMemoryApi> api,
                                 std::shared_ptr<TcpStagingPool> pool)
    : api_(std::move(api)), pool_(std::move(pool)) {}

Status TcpDeviceStager::start() {
  KVF_ASSIGN_OR_RETURN(thread_, start_named_thread("kvf-tcp-stage", [this] { run(); }));
  return Status::Ok();
}

TcpDeviceStager::~TcpDeviceStager() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    closing_.store(true);
  }
  cv_.notify_all();
  // A wait for a staging buffer sees closing_ within kStagingRecheck.
  if (thread_.joinable()) thread_.join();
  for (DeviceStageJob& job : queue_) {
    job.deliver(PeerDisconnected("tcp link closed before the chunk was staged"));
  }
  for (auto& [device, stream] : streams_) api_->destroy_stream(stream);
}

void TcpDeviceStager::enqueue(std::vector<DeviceStageJob> jobs) {
  {
    std::lock_guard lock(mu_);
    for (DeviceStageJob& job : jobs) queue_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void TcpDeviceStager::run() {
  for (;;) {
    DeviceStageJob job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;  // the destructor fails what is queued
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    Result<StagingLease> staged = stage(job);
    if (!staged.ok() && !failed_before(job)) {
      // The rest of this batch is not staged, hence not sent.
      std::erase_if(failed_, [](const FailedBatch& f) { return f.batch.expired(); });
      failed_.push_back({job.batch, staged.status()});
    }
    job.deliver(std::move(staged));
  }
}

const TcpDeviceStager::FailedBatch* TcpDeviceStager::failed_before(
    const DeviceStageJob& job) const {
  for (const FailedBatch& f : failed_) {
    if (f.batch.lock() == job.batch) return &f;
  }
  return nullptr;
}

Result<CudaStream> TcpDeviceStager::stream_for(int device) {
  if (auto it = streams_.find(device); it != streams_.end()) return it->second;
  KVF_ASSIGN_OR_RETURN(CudaStream s, api_->create_stream(device));
  streams_.emplace(device, s);
  return s;
}

Result<StagingLease> TcpDeviceStager::stage(DeviceStageJob& job) {
  BatchProgress& batch = *job.batch;
  if (const FailedBatch* f = failed_before(job)) return f->why;
  KVF_RETURN_IF_ERROR(batch.stop_reason());
  if (job.length > pool_->buffer_bytes()) {
    return Internal(fmt::format("tcp stager: a {}-byte chunk exceeds the {}-byte staging buffers",
                                job.length, pool_->buffer_bytes()));
  }
  KVF_ASSIGN_OR_RETURN(StagingLease lease, pool_->acquire(batch.deadline(), [&] {
    if (closing_.load()) return PeerDisconnected("tcp link closed");
    return batch.stop_reason();
  }));
  KVF_ASSIGN_OR_RETURN(CudaStream stream, stream_for(job.device));
  if (job.after_event != nullptr) {
    KVF_RETURN_IF_ERROR(api_->stream_wait_event(stream, job.after_event));
  }
  KVF_RETURN_IF_ERROR(api_->copy_async(lease.data(), job.device_src, job.length,
                                       CudaCopyDirection::kDeviceToHost, stream));
  KVF_ASSIGN_OR_RETURN(CudaEvent done, api_->record_event(stream));
  Status copied = api_->wait_event(done);
  api_->destroy_event(done);
  if (!copied.ok()) {
    return Internal(fmt::format("copying {} bytes of device memory at {} to a staging buffer: {}",
                                job.length, static_cast<const void*>(job.device_src),
                                copied.message()));
  }
  return lease;
}

}  // namespace kvferry
