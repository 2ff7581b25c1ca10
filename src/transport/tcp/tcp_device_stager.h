// TcpDeviceStager: the sending half of tcp with device memory. A WRITE whose source is this
// engine's device memory is sent from pinned host buffers (TcpStagingPool): for each chunk,
// in order, the stager leases a buffer (waiting while the pool is exhausted), copies the
// chunk device -> host with an asynchronous copy on its stream, waits for the copy's event,
// and hands the staged chunk to its lane. The lane's sending turn puts chunk n on the wire
// while the stager copies chunk n+1: copy and send overlap, and the pool bounds how far the
// stager runs ahead. The lease is returned when the lane is done with the chunk.
//
// Ordering and failure: a job carrying `after_event` (SubmitOptions::after_cuda_event, on
// the first device chunk of a part) makes the stream wait for it before its copy. A copy
// that fails fails its chunk, and every later chunk of the same batch that reaches the
// stager fails with the same error without being copied or sent: nothing of the batch
// after the failure is sent, so nothing after it is acknowledged. A batch that is stopped
// (deadline, cancel, peer death) stops staging between chunks; a chunk staged but not yet
// sent is failed by its lane (it asks stop_reason() before sending).
//
// Thread-safety: enqueue() from any thread; one stager thread does the copies. Destroying
// the stager fails the jobs it has not run with PeerDisconnected.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/batch_progress.h"
#include "transport/tcp/tcp_staging_pool.h"

namespace kvferry {

struct DeviceStageJob {
  std::shared_ptr<BatchProgress> batch;
  const char* device_src = nullptr;
  uint64_t length = 0;
  int device = 0;
  CudaEvent after_event = nullptr;  // ordered before this job's copy when set
  // Called once, on the stager thread: the staged bytes (lease.data(), `length` of them),
  // or why the chunk was not staged (its task must then be finished with that status).
  std::function<void(Result<StagingLease>)> deliver;
};

class TcpDeviceStager {
 public:
  TcpDeviceStager(std::shared_ptr<CudaMemoryApi> api, std::shared_ptr<TcpStagingPool> pool);
  ~TcpDeviceStager();
  // Starts its thread; Internal when it cannot start (core/named_thread.h). Once, before use.
  Status start();
  TcpDeviceStager(const TcpDeviceStager&) = delete;
  TcpDeviceStager& operator=(const TcpDeviceStager&) = delete;

  void enqueue(std::vector<DeviceStageJob> jobs);

 private:
  void run();
  Result<StagingLease> stage(DeviceStageJob& job);
  Result<CudaStream> stream_for(int device);
  struct FailedBatch {
    std::weak_ptr<BatchProgress> batch;
    Status why;
  };
  const FailedBatch* failed_before(const DeviceStageJob& job) const;

  std::shared_ptr<CudaMemoryApi> api_;
  std::shared_ptr<TcpStagingPool> pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<DeviceStageJob> queue_;  // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  std::atomic<bool> closing_{false};  // stopping_, for a wait that does not hold mu_
  // Stager thread only: streams by device, and the batches (still alive) whose staging failed.
  std::unordered_map<int, CudaStream> streams_;
  std::vector<FailedBatch> failed_;
  std::thread thread_;
};

}  // namespace kvferry
