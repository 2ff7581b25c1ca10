// BatchProgress: the completion side of one submitted batch, as transports see it — the
// narrow API through which a transport runs its part of a batch and reports how it ended.
//
// A transport that is given a part of a batch (BatchPart, transport.h):
//  * declares how many tasks it splits its part into (add_tasks) before any of them can
//    finish, and finishes each exactly once with its status (finish_task); the batch ends
//    when every task of every part has finished: Completed, or the first error;
//  * asks stop_reason() before it starts a piece of work (a chunk, a slice, a send): OK
//    while the batch may proceed, else why not (stopped, peer gone, past the deadline);
//  * holds a CopyGuard while this process copies bytes of the batch (stop() waits for it,
//    so nothing lands after cancel() returns), taken *before* it asks stop_reason();
//  * holds a WireGuard while a request of the batch is in the peer's hands (on the wire, or
//    enqueued on a device): stop() waits for those until the batch deadline, after which
//    the receiver lands nothing more of it: it begins to land a write's bytes no later than
//    kLandingMarginNs before the deadline (see docs/TRANSPORTS.md, "Deadlines");
//  * calls mark_posted() once its part is posted, and may register a BatchHelper that a
//    thread about to wait for the batch runs instead of sleeping.
//
// The engine owns the rest (engine/batch_record.h derives from this class): it sets the
// telemetry and pins, stops the batch on cancel or timeout, and reads its status.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "core/net.h"
#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "transport/peer_liveness.h"
#include "transport/region_index.h"

namespace kvferry {

// A receiver begins to land a write's bytes (a receive straight into memory, a copy from a
// buffer, a copy into device memory) no later than this long before the request's deadline
// on its clock: the initiator reports the batch timed out at that deadline (its clock, never
// earlier than the one converted for the receiver), and a landing begun closer (a 1 MiB
// receive, an 8 MiB copy, a device copy waiting its turn on the stream) could still be under
// way then.
inline constexpr int64_t kLandingMarginNs = 2'000'000;

// Work a waiting thread may do for a batch (the memcpy executor's unstarted slices, a tcp
// lane's answers): it returns by `until` (the wait's end), or soon after.
class BatchHelper {
 public:
  virtual ~BatchHelper() = default;
  virtual void help(Clock::time_point until) = 0;
  // For a thread that asks the batch's state without waiting (status()): takes in what has
  // already arrived for it (a tcp lane's answers), never waits for more nor does work that
  // takes long. Nothing by default.
  virtual void collect() {}
};

class BatchProgress {
 public:
  BatchProgress(std::shared_ptr<PeerLiveness> peer, std::chrono::milliseconds timeout);
  virtual ~BatchProgress() = default;
  BatchProgress(const BatchProgress&) = delete;
  BatchProgress& operator=(const BatchProgress&) = delete;

  Clock::time_point start() const { return start_; }
  Clock::time_point deadline() const { return deadline_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  const PeerLiveness& peer() const { return *peer_; }

  // Why work of this batch must not start now — the status stop() was called with, the
  // peer's disconnection, or Timeout past the deadline — or OK.
  Status stop_reason() const;

  void add_tasks(int n) { pending_tasks_.fetch_add(n); }
  // Records a task's outcome; the last task makes the batch final (first error wins).
  void finish_task(const Status& task_status);
  // Records the time the last part was posted (telemetry).
  void mark_posted();
  void add_helper(std::shared_ptr<BatchHelper> helper);
  // Whether the batch is final (Completed or Failed): a lock-free read for a hot wait.
  bool is_final() const { return final_.load(std::memory_order_acquire); }

  // Held while this process copies bytes of the batch; stop() waits until none is held.
  class CopyGuard {
   public:
    explicit CopyGuard(BatchProgress& b) : b_(b) { b_.active_copies_.fetch_add(1); }
    ~CopyGuard() { b_.active_copies_.fetch_sub(1); }
    CopyGuard(const CopyGuard&) = delete;
    CopyGuard& operator=(const CopyGuard&) = delete;

   private:
    BatchProgress& b_;
  };
  CopyGuard copying() { return CopyGuard(*this); }

  // Held while a request of the batch is in the peer's (or a device's) hands; stop() waits
  // for these until the deadline. Movable, so it can travel with the request.
  class WireGuard {
   public:
    WireGuard() = default;
    explicit WireGuard(BatchProgress* b) : b_(b) {
      if (b_ != nullptr) b_->wire_in_flight_.fetch_add(1);
    }
    WireGuard(WireGuard&& o) noexcept : b_(std::exchange(o.b_, nullptr)) {}
    WireGuard& operator=(WireGuard&& o) noexcept {
      if (this != &o) {
        release();
        b_ = std::exchange(o.b_, nullptr);
      }
      return *this;
    }
    ~WireGuard() { release(); }
    void release() {
      if (b_ != nullptr) std::exchange(b_, nullptr)->wire_in_flight_.fetch_sub(1);
    }

   private:
    BatchProgress* b_ = nullptr;
  };
  WireGuard on_wire() { return WireGuard(this); }

 protected:
  // Engine side (BatchRecord).
  void set_work(uint64_t ops_submitted, uint64_t ops_posted, uint64_t bytes,
                std::vector<RegionUse*> pins);
  // Makes the batch final with `why` unless it already is; returns once no copy of it is
  // running and none will start (and no request of it is in the peer's hands, or the
  // deadline passed).
  void stop(const Status& why);
  BatchStatus snapshot() const;
  // Waits until the batch is final or `until`.
  void wait_until(Clock::time_point until) const;
  void help(Clock::time_point until);
  // BatchHelper::collect of each helper.
  void collect();
  // The local regions the batch pins; released once nothing can read or write them.
  const std::vector<RegionUse*>& pins() const { return pins_; }
  // Asks for on_final once the batch is final (set before posting; metrics use it).
  void report_final() { report_final_ = true; }
  // Called once, under the batch's lock, when the batch becomes final: keep it to a few
  // relaxed atomic updates.
  virtual void on_final(const Status& /*status*/, std::chrono::nanoseconds /*elapsed*/) {}

 private:
  void finalize_locked(const Status& status);
  void release_pins();
  std::vector<std::shared_ptr<BatchHelper>> helpers() const;

  const std::shared_ptr<PeerLiveness> peer_;
  const Clock::time_point start_;
  const std::chrono::milliseconds timeout_;
  const Clock::time_point deadline_;
  uint64_t ops_submitted_ = 0;  // set before posting, then immutable
  uint64_t ops_posted_ = 0;
  uint64_t bytes_ = 0;
  std::vector<RegionUse*> pins_;

  std::atomic<int> pending_tasks_{0};
  std::atomic<int> active_copies_{0};
  std::atomic<int> wire_in_flight_{0};
  std::atomic<bool> stopped_{false};
  std::atomic<bool> pins_released_{false};
  std::atomic<bool> has_helpers_{false};
  std::atomic<bool> final_{false};  // state_ != kPending, readable without mu_
  bool report_final_ = false;       // set before posting, then immutable

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  BatchState state_ = BatchState::kPending;            // guarded by mu_
  Status error_;                                       // guarded by mu_
  Status first_task_error_;                            // guarded by mu_
  Status stopped_with_;                                // why stop() was called; guarded by mu_
  std::chrono::nanoseconds post_time_{0};              // guarded by mu_
  std::chrono::nanoseconds complete_time_{0};          // guarded by mu_
  std::vector<std::shared_ptr<BatchHelper>> helpers_;  // guarded by mu_
};

}  // namespace kvferry
