#include "transport/cuda_ipc/cuda_copy_queue.h"

#include <cuda_runtime_api.h>

#include "core/logging.h"
#include "core/named_thread.h"
#include "transport/cuda_ipc/cuda_runtime_util.h"

namespace kvferry::cuda_ipc {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

#if CUDART_VERSION >= 12080
// One call for the whole batch. The copies of one batch never depend on each other (the
// resolver merged overlapping-free ranges), so the call's freedom to reorder is harmless.
cudaError_t memcpy_batch(const std::vector<void*>& dsts, const std::vector<const void*>& srcs,
                         const std::vector<size_t>& sizes, cudaStream_t stream) {
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // after after_event's work
  attributes.flags = cudaMemcpyFlagDefault;
  size_t first_copy = 0;
#if CUDART_VERSION >= 13000
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attributes,
                              &first_copy, 1, stream);
#else
  // 12.8/12.9: non-const arrays and a failIdx out-parameter.
  size_t fail_index = 0;
  return cudaMemcpyBatchAsync(const_cast<void**>(dsts.data()), const_cast<void**>(srcs.data()),
                              const_cast<size_t*>(sizes.data()), dsts.size(), &attributes,
                              &first_copy, 1, &fail_index, stream);
#endif
}
#endif

}  // namespace

Result<std::unique_ptr<CudaCopyQueue>> CudaCopyQueue::start() {
  std::unique_ptr<CudaCopyQueue> queue(new CudaCopyQueue());
  CudaCopyQueue* q = queue.get();
  KVF_ASSIGN_OR_RETURN(queue->completion_thread_,
                       start_named_thread("kvf-cuda-done", [q] { q->completion_loop(); }));
  return queue;
}

CudaCopyQueue::~CudaCopyQueue() {
  {
    std::lock_guard lock(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (completion_thread_.joinable()) completion_thread_.join();
  for (auto& [device, event] : free_events_) cudaEventDestroy(as_event(event));
  for (auto& [device, stream] : streams_) cudaStreamDestroy(as_stream(stream));
  cudaGetLastError();
}

Result<void*> CudaCopyQueue::stream_for(int device) {
  if (auto it = streams_.find(device); it != streams_.end()) return it->second;
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return Internal(cuda_error_text("cudaStreamCreateWithFlags", e));
  }
  streams_.emplace(device, stream);
  return static_cast<void*>(stream);
}

Result<void*> CudaCopyQueue::take_event(int device) {
  {
    std::lock_guard lock(queue_mu_);
    if (auto it = free_events_.find(device); it != free_events_.end()) {
      void* event = it->second;
      free_events_.erase(it);
      return event;
    }
  }
  cudaEvent_t event = nullptr;
  // Blocking sync: the completion thread sleeps in cudaEventSynchronize instead of spinning.
  if (cudaError_t e =
          cudaEventCreateWithFlags(&event, cudaEventBlockingSync | cudaEventDisableTiming);
      e != cudaSuccess) {
    return Internal(cuda_error_text("cudaEventCreateWithFlags", e));
  }
  return static_cast<void*>(event);
}

Status CudaCopyQueue::enqueue_copies(std::span<const ResolvedOp> spans, void* stream) {
#if CUDART_VERSION >= 12080
  if (!batch_call_refused_) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    dsts.reserve(spans.size());
    srcs.reserve(spans.size());
    sizes.reserve(spans.size());
    for (const ResolvedOp& span : spans) {
      dsts.push_back(span.dst());
      srcs.push_back(span.src());
      sizes.push_back(span.length);
    }
    cudaError_t e = memcpy_batch(dsts, srcs, sizes, as_stream(stream));
    if (e == cudaSuccess) return Status::Ok();
    // A driver older than the runtime, or a memory kind the batch call does not take. Had
    // part of it been enqueued, copying it again below is harmless (same bytes, same place).
    log().warn(
        "cudaMemcpyBatchAsync refused a batch of {} copies ({}); using cudaMemcpyAsync "
        "per copy from now on",
        spans.size(), cuda_error_text("cudaMemcpyBatchAsync", e));
    batch_call_refused_ = true;
  }
#endif
  for (size_t i = 0; i < spans.size(); ++i) {
    const ResolvedOp& span = spans[i];
    cudaError_t e =
        cudaMemcpyAsync(span.dst(), span.src(), span.length, cudaMemcpyDefault, as_stream(stream));
    if (e != cudaSuccess) {
      // Copies before i are enqueued and cannot be recalled: make the stream drain them
      // before the batch is reported as never started.
      std::string text = cuda_error_text("cudaMemcpyAsync", e);
      if (i > 0) cudaStreamSynchronize(as_stream(stream));
      return Internal("copy " + std::to_string(i) + " of " + std::to_string(spans.size()) + ": " +
                      text);
    }
  }
  return Status::Ok();
}

Status CudaCopyQueue::post(const BatchPart& part, int device,
                           std::vector<std::shared_ptr<const void>> keep_alive) {
  void* after_event = part.after_cuda_event;
  std::lock_guard post_lock(post_mu_);
  ScopedDevice scope(device);
  if (scope.status() != cudaSuccess) {
    return Internal(
        cuda_error_text("cudaSetDevice(" + std::to_string(device) + ")", scope.status()));
  }
  KVF_ASSIGN_OR_RETURN(void* stream, stream_for(device));
  KVF_ASSIGN_OR_RETURN(void* event, take_event(device));
  auto give_back_event = [&] {
    std::lock_guard lock(queue_mu_);
    free_events_.emplace(device, event);
  };
  if (after_event != nullptr) {
    if (cudaError_t e = cudaStreamWaitEvent(as_stream(stream), as_event(after_event), 0);
        e != cudaSuccess) {
      give_back_event();
      return InvalidArgument(cuda_error_text("cudaStreamWaitEvent(after_cuda_event)", e));
    }
  }
  // Counted before the first copy is enqueued, so a stop() racing with us waits for it.
  BatchProgress::WireGuard wire = part.batch->on_wire();
  Status enqueued = enqueue_copies(part.spans, stream);
  if (enqueued.ok()) {
    if (cudaError_t e = cudaEventRecord(as_event(event), as_stream(stream)); e != cudaSuccess) {
      enqueued = Internal(cuda_error_text("cudaEventRecord", e));
      cudaStreamSynchronize(as_stream(stream));  // the copies are enqueued: let them finish
    }
  }
  if (!enqueued.ok()) {
    give_back_event();
    return enqueued;
  }
  part.batch->add_tasks(1);
  part.batch->mark_posted();
  {
    std::lock_guard lock(queue_mu_);
    queue_.push_back(Pending{part.batch, std::move(wire), event, device, std::move(keep_alive)});
  }
  queue_cv_.notify_one();
  return Status::Ok();
}

void CudaCopyQueue::completion_loop() {
  for (;;) {
    Pending pending;
    {
      std::unique_lock lock(queue_mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every posted batch has ended
      pending = std::move(queue_.front());
      queue_.pop_front();
    }
    BatchProgress& batch = *pending.batch;
    Status outcome;
    if (cudaError_t e = cudaEventSynchronize(as_event(pending.event)); e != cudaSuccess) {
      outcome = Internal(cuda_error_text("device copy failed: cudaEventSynchronize", e));
    } else if (batch.peer().is_disconnected()) {
      // The bytes reached a peer that has gone away (or restarted): they are of no use.
      outcome = PeerDisconnected("peer " + batch.peer().name() +
                                 " disconnected: " + batch.peer().disconnect_reason());
    }
    pending.keep_alive.clear();  // may close IPC handles: the copies are done
    {
      std::lock_guard lock(queue_mu_);
      free_events_.emplace(pending.device, pending.event);
    }
    pending.wire.release();
    batch.finish_task(outcome);
  }
}

}  // namespace kvferry::cuda_ipc
