// CudaCopyQueue: enqueues a batch's copies on a device stream and finishes the batch when
// the device is done, from its own completion thread.
//
// One batch = one cudaMemcpyBatchAsync (CUDA >= 12.8; one call however many spans), or one
// cudaMemcpyAsync per merged span where the batch call is missing or refuses the batch,
// then one event recorded after them. The completion thread waits on the events in
// submission order (a blocking-sync event: it sleeps, it does not spin) and calls
// BatchProgress::finish_task, so wait() sleeps on the batch's condition variable and
// status() is right without anyone polling the device.
//
// Streams: one non-blocking stream per device, created on first use. A batch runs on the
// stream of `device` (the device its spans belong to); copies to another device's memory
// go over peer access (UVA).
//
// Thread-safety: post() may be called concurrently; posts are serialised so the
// completion order matches the enqueue order. The destructor waits for every posted batch
// to end.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvferry/status.h"
#include "transport/transport.h"

namespace kvferry::cuda_ipc {

class CudaCopyQueue {
 public:
  // A queue whose completion thread runs; Internal when it cannot start.
  static Result<std::unique_ptr<CudaCopyQueue>> start();
  ~CudaCopyQueue();
  CudaCopyQueue(const CudaCopyQueue&) = delete;
  CudaCopyQueue& operator=(const CudaCopyQueue&) = delete;

  // Enqueues every span of `part` (pointers valid in this process) on `device`'s stream,
  // after part.after_cuda_event (a cudaEvent_t, or null) when given. `keep_alive` is
  // released once the copies are done. On success the part is posted as one task that ends
  // through finish_task; on error nothing was enqueued and no task was added.
  Status post(const BatchPart& part, int device,
              std::vector<std::shared_ptr<const void>> keep_alive);

 private:
  CudaCopyQueue() = default;
  struct Pending {
    std::shared_ptr<BatchProgress> batch;
    BatchProgress::WireGuard wire;  // the copies are enqueued on the device
    void* event = nullptr;          // cudaEvent_t of `device`
    int device = 0;
    std::vector<std::shared_ptr<const void>> keep_alive;
  };
  // Enqueues the copies of `batch` on `stream`; the runtime error text on failure.
  Status enqueue_copies(std::span<const ResolvedOp> spans, void* stream);
  Result<void*> stream_for(int device);  // post_mu_ held; the current device is `device`
  Result<void*> take_event(int device);  // the current device is `device`
  void completion_loop();

  std::mutex post_mu_;
  std::map<int, void*> streams_;           // cudaStream_t by device; post_mu_
  bool batch_call_refused_ = false;        // post_mu_: the batch call failed once; use the fallback
  std::multimap<int, void*> free_events_;  // cudaEvent_t by device; queue_mu_

  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread completion_thread_;  // started by start(), once everything above exists
};

}  // namespace kvferry::cuda_ipc
