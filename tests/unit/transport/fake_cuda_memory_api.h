// FakeCudaMemoryApi: a CudaMemoryApi over a table of pretend allocations, so the host-side
// logic of the device paths (cuda_ipc's export checks and handle caching, tcp's staging
// pipeline) is tested without a GPU. "Device memory" is host memory the test lists in
// `allocations`; pinned buffers are plain heap memory; a stream is a worker thread that runs
// its copies (memcpy) in order, each after an injectable delay; a copy can be made to fail.
//
// Thread-safety: the configuration fields are set before use; the calls are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "transport/cuda_memory_api.h"

namespace kvferry::testing {

class FakeCudaMemoryApi final : public CudaMemoryApi {
 public:
  struct Allocation {
    uint64_t bytes = 0;
    PointerKind kind = PointerKind::kDevice;
    int device = 0;
  };
  // Pretend allocations of this process, by base address.
  std::map<uint64_t, Allocation> allocations;
  // What opening a handle yields: the handle's first byte picks the entry.
  std::map<uint8_t, AllocationRange> openable;
  int opens = 0;
  int closes = 0;
  int last_open_device = -1;

  // Staging faults: the copy with this 1-based sequence number (over all streams) fails,
  // reported at the event after it; 0: none fails.
  std::atomic<uint64_t> fail_copy_number{0};
  // Each copy waits this long on its stream before it runs.
  std::atomic<int64_t> copy_delay_us{0};
  // Called on the stream's thread before each copy runs (a test may kill a peer there).
  std::function<void(uint64_t copy_number)> before_copy;

  ~FakeCudaMemoryApi() override {
    std::lock_guard lock(mu_);
    for (void* p : pinned_) ::operator delete(p);
  }

  static IpcHandle handle_for(uint8_t id) {
    IpcHandle h{};
    h[0] = id;
    h[63] = 0xab;
    return h;
  }

  // Registers [p, +bytes) as device memory of `device`.
  void pretend_device(const void* p, uint64_t bytes, int device = 0) {
    allocations[reinterpret_cast<uint64_t>(p)] = Allocation{bytes, PointerKind::kDevice, device};
  }

  uint64_t copies_run() const { return copies_run_.load(); }
  // Every copy enqueued so far has run (its bytes are where they go).
  bool copies_settled() const { return copies_run_.load() == copies_enqueued_.load(); }
  uint64_t pinned_bytes_allocated() const {
    std::lock_guard lock(mu_);
    return pinned_bytes_;
  }
  uint64_t device_to_host_copies() const { return d2h_.load(); }
  uint64_t host_to_device_copies() const { return h2d_.load(); }
  int streams_waiting_on_events() const { return stream_waits_.load(); }

  Result<PointerInfo> pointer_info(const void* ptr) override {
    const Allocation* a = find(ptr);
    if (a == nullptr) return PointerInfo{PointerKind::kUnregistered, -1};
    return PointerInfo{a->kind, a->device};
  }
  Result<AllocationRange> allocation_range(const void* ptr) override {
    auto p = reinterpret_cast<uint64_t>(ptr);
    for (const auto& [base, range] : openable) {
      if (p == range.base) return range;
    }
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return Internal("not an allocation");
    --it;
    if (p >= it->first + it->second.bytes) return Internal("not an allocation");
    return AllocationRange{it->first, it->second.bytes};
  }
  Result<IpcHandle> export_handle(void* base, int /*device*/) override {
    return handle_for(static_cast<uint8_t>(reinterpret_cast<uint64_t>(base) >> 20));
  }
  Result<void*> open_handle(const IpcHandle& handle, int device) override {
    auto it = openable.find(handle[0]);
    if (it == openable.end()) return Internal("cudaIpcOpenMemHandle: invalid handle");
    ++opens;
    last_open_device = device;
    return reinterpret_cast<void*>(it->second.base);
  }
  void close_handle(void* /*base*/) override { ++closes; }

  Result<void*> alloc_pinned(uint64_t bytes) override {
    void* p = ::operator new(bytes);
    std::lock_guard lock(mu_);
    pinned_.insert(p);
    pinned_bytes_ += bytes;
    return p;
  }
  void free_pinned(void* ptr) override {
    std::lock_guard lock(mu_);
    if (pinned_.erase(ptr) != 0) ::operator delete(ptr);
  }

  Result<CudaStream> create_stream(int /*device*/) override {
    auto* s = new Stream(*this);  // owned by the caller until destroy_stream
    return static_cast<CudaStream>(s);
  }
  void destroy_stream(CudaStream stream) override { delete static_cast<Stream*>(stream); }
  Status stream_wait_event(CudaStream stream, CudaEvent event) override {
    if (event == nullptr) return InvalidArgument("cudaStreamWaitEvent: null event");
    ++stream_waits_;
    static_cast<Stream*>(stream)->enqueue(Work{});  // an ordering point; nothing to copy
    return Status::Ok();
  }
  Status copy_async(void* dst, const void* src, uint64_t bytes, CudaCopyDirection direction,
                    CudaStream stream) override {
    const bool d2h = direction == CudaCopyDirection::kDeviceToHost;
    const void* device_side = d2h ? src : dst;
    if (find(device_side) == nullptr) {
      return InvalidArgument("cudaMemcpyAsync: not device memory");
    }
    (d2h ? d2h_ : h2d_).fetch_add(1);
    Work w;
    w.dst = dst;
    w.src = src;
    w.bytes = bytes;
    w.number = ++copies_enqueued_;
    static_cast<Stream*>(stream)->enqueue(std::move(w));
    return Status::Ok();
  }
  Result<CudaEvent> record_event(CudaStream stream) override {
    auto* s = static_cast<Stream*>(stream);
    auto* e = new Event{s, s->mark_event()};  // owned by the caller until destroy_event
    return static_cast<CudaEvent>(e);
  }
  Status wait_event(CudaEvent event) override {
    auto* e = static_cast<Event*>(event);
    return e->stream->wait_for(e->from, e->position);
  }
  void destroy_event(CudaEvent event) override { delete static_cast<Event*>(event); }

 private:
  struct Work {
    void* dst = nullptr;
    const void* src = nullptr;
    uint64_t bytes = 0;
    uint64_t number = 0;  // 0: an ordering point
  };

  class Stream {
   public:
    explicit Stream(FakeCudaMemoryApi& api) : api_(api), thread_([this] { run(); }) {}
    ~Stream() {
      {
        std::lock_guard lock(mu_);
        stopping_ = true;
      }
      cv_.notify_all();
      thread_.join();
    }
    void enqueue(Work w) {
      {
        std::lock_guard lock(mu_);
        queue_.push_back(w);
        ++enqueued_;
      }
      cv_.notify_all();
    }
    // {items enqueued before the previous event, items enqueued now}: an event's span.
    std::pair<uint64_t, uint64_t> mark_event() {
      std::lock_guard lock(mu_);
      const uint64_t from = last_event_;
      last_event_ = enqueued_;
      return {from, enqueued_};
    }
    // Waits until the first `position` items ran; fails when one in (from, position] failed.
    Status wait_for(uint64_t from, uint64_t position) {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return done_ >= position; });
      for (uint64_t f : failed_) {
        if (f > from && f <= position) {
          return Internal("cudaEventSynchronize: cudaErrorLaunchFailure (injected copy failure)");
        }
      }
      return Status::Ok();
    }

   private:
    void run() {
      for (;;) {
        Work w;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
          if (queue_.empty()) return;
          w = queue_.front();
          queue_.pop_front();
        }
        bool failed = false;
        if (w.number != 0) {
          if (int64_t us = api_.copy_delay_us.load(); us > 0) {
            std::this_thread::sleep_for(std::chrono::microseconds(us));
          }
          if (api_.before_copy) api_.before_copy(w.number);
          failed = w.number == api_.fail_copy_number.load();
          if (!failed) std::memcpy(w.dst, w.src, w.bytes);
          api_.copies_run_.fetch_add(1);
        }
        {
          std::lock_guard lock(mu_);
          ++done_;
          if (failed) failed_.push_back(done_);
        }
        cv_.notify_all();
      }
    }

    FakeCudaMemoryApi& api_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Work> queue_;
    uint64_t enqueued_ = 0;
    uint64_t done_ = 0;
    uint64_t last_event_ = 0;
    std::vector<uint64_t> failed_;  // positions of failed copies
    bool stopping_ = false;
    std::thread thread_;
  };

  struct Event {
    Event(Stream* s, std::pair<uint64_t, uint64_t> span)
        : stream(s), from(span.first), position(span.second) {}
    Stream* stream;
    uint64_t from;
    uint64_t position;
  };

  const Allocation* find(const void* ptr) const {
    auto p = reinterpret_cast<uint64_t>(ptr);
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) return nullptr;
    --it;
    return p < it->first + it->second.bytes ? &it->second : nullptr;
  }

  mutable std::mutex mu_;
  std::set<void*> pinned_;  // guarded by mu_
  uint64_t pinned_bytes_ = 0;
  std::atomic<uint64_t> copies_enqueued_{0};
  std::atomic<uint64_t> copies_run_{0};
  std::atomic<uint64_t> d2h_{0};
  std::atomic<uint64_t> h2d_{0};
  std::atomic<int> stream_waits_{0};
};

}  // namespace kvferry::testing
