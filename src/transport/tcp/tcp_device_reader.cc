#include "transport/tcp/tcp_device_reader.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvferry {
namespace {

// One request being staged: its pieces come back one by one (in order, on the stager's
// thread); the last one completes it.
struct PendingRead {
  std::shared_ptr<StagedReadInbox> inbox;
  StagedRead result;
  size_t outstanding = 0;
  std::shared_ptr<void> keep;
};

}  // namespace

void StagedReadInbox::put(StagedRead read) {
  std::lock_guard lock(mu_);
  if (!wake_) return;
  done_.push_back(std::move(read));
  wake_();
}

std::vector<StagedRead> StagedReadInbox::take() {
  std::lock_guard lock(mu_);
  return std::exchange(done_, {});
}

void StagedReadInbox::close() {
  std::vector<StagedRead> dropped;
  std::lock_guard lock(mu_);
  wake_ = nullptr;
  dropped.swap(done_);
}

TcpDeviceReadStager::TcpDeviceReadStager(std::shared_ptr<CudaMemoryApi> api,
                                         std::shared_ptr<TcpStagingPool> pool)
    : pool_(pool), stager_(std::move(api), std::move(pool)) {}

Result<std::unique_ptr<TcpDeviceReadStager>> TcpDeviceReadStager::start(
    std::shared_ptr<CudaMemoryApi> api, std::shared_ptr<TcpStagingPool> pool) {
  std::unique_ptr<TcpDeviceReadStager> stager(
      new TcpDeviceReadStager(std::move(api), std::move(pool)));
  KVF_RETURN_IF_ERROR(stager->stager_.start());
  return stager;
}

void TcpDeviceReadStager::stage(const std::shared_ptr<StagedReadInbox>& inbox, uint64_t conn,
                                uint64_t request_id, const char* device_src, uint64_t length,
                                int device, Clock::time_point deadline,
                                std::shared_ptr<PeerLiveness> alive, std::shared_ptr<void> keep) {
  const uint64_t piece_bytes = pool_->buffer_bytes();
  const uint64_t pieces = (length + piece_bytes - 1) / piece_bytes;
  StagedRead result;
  result.conn = conn;
  result.request_id = request_id;
  result.length = length;
  if (pieces > static_cast<uint64_t>(pool_->max_buffers())) {
    // All of a request's pieces are held until it is answered whole.
    result.status = InvalidArgument(
        fmt::format("a READ of {} bytes of device memory needs {} staging buffers of {} bytes; "
                    "the receiver has {}",
                    length, pieces, piece_bytes, pool_->max_buffers()));
  }
  if (pieces == 0 || !result.status.ok()) {
    inbox->put(std::move(result));
    return;
  }
  // The request as the stager sees a batch: its deadline, and its connection as the "peer".
  const auto left = std::max(std::chrono::nanoseconds::zero(), deadline - Clock::now());
  auto batch = std::make_shared<BatchProgress>(
      std::move(alive), std::chrono::duration_cast<std::chrono::milliseconds>(left));
  auto pending = std::make_shared<PendingRead>();
  pending->inbox = inbox;
  pending->result = std::move(result);
  pending->result.pieces.resize(pieces);
  pending->outstanding = pieces;
  pending->keep = std::move(keep);
  std::vector<DeviceStageJob> jobs;
  jobs.reserve(pieces);
  for (uint64_t i = 0; i < pieces; ++i) {
    DeviceStageJob job;
    job.batch = batch;
    job.device_src = device_src + i * piece_bytes;
    job.length = std::min(piece_bytes, length - i * piece_bytes);
    job.device = device;
    job.deliver = [pending, i](Result<StagingLease> staged) {
      StagedRead& r = pending->result;
      if (staged.ok()) {
        r.pieces[i] = std::move(*staged);
      } else if (r.status.ok()) {
        r.status = staged.status();
      }
      if (--pending->outstanding != 0) return;
      pending->keep.reset();  // every copy of the request has completed (or never ran)
      if (!r.status.ok()) r.pieces.clear();
      pending->inbox->put(std::move(r));
    };
    jobs.push_back(std::move(job));
  }
  stager_.enqueue(std::move(jobs));
}

Result<TcpDeviceReadStager*> TcpDeviceReadService::stager() {
  std::lock_guard lock(mu_);
  if (stager_) return stager_.get();
  if (!staging_ || !staging_->built()) {
    return NotSupported("this receiver's build has no CUDA: tcp cannot read device memory");
  }
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, staging_->api());
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<TcpStagingPool> pool, staging_->serve_pool());
  KVF_ASSIGN_OR_RETURN(stager_, TcpDeviceReadStager::start(std::move(api), std::move(pool)));
  return stager_.get();
}

}  // namespace kvferry
