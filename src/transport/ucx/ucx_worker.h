// UcxWorker: one engine's UCX context and worker, and the one progress thread that runs
// the worker. Every UCX call on the worker (endpoints, put/get, flush, close, memory
// registration) runs in a turn of the worker; other threads hand it work (post, call). Turns
// are run by the progress thread, and for a small part by the threads that want it: the one
// that posts it sends it (post_here), the one that waits for it takes in its answer (Driver),
// one asking its state takes in what came (poll_here); never two turns at once. The progress
// thread sleeps on the worker's event fd (ucp_worker_arm), an eventfd of its own, which post
// writes only once the thread has decided to sleep, and a timerfd others set for a channel's
// deadline, so an idle engine does not spin; it also runs on the passive side, where UCX's
// emulated put/get are served by the target's worker.
//
// Channels with work (UcxPumped) are pumped after every progress round until they report
// idle; the thread wakes for the earliest deadline any of them reports.
//
// The worker also serves kvferry's active messages (ucx_am_wire.h), both sides: as a
// target it checks each kWrite/kRead against this engine's registered regions and its
// deadline before a byte moves (ucx_am_handlers.cc), receives a rendezvous write into a
// buffer of its own and copies it to its destination (pinned only for the copy) once
// complete, within frame_rest_timeout, so a sender that stops or dies pins nothing; as an initiator
// it routes each reply to the UcxAmClient (a channel) waiting for that request id, and drops
// replies nobody waits for any more (a batch that timed out).
//
// Ownership: the transport owns the worker; channels are kept alive by the active set while
// they have work. The destructor stops the thread after letting channels close (bounded).
//
// Thread-safety: post and call from any thread except one running a turn (call would wait
// for itself); context() and the read-only accessors from any thread. "In a turn" below:
// only code running in a turn of the worker (tasks, UCX callbacks, pumps) touches it.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/log_throttle.h"
#include "core/net.h"
#include "kvferry/defaults.h"
#include "kvferry/status.h"
#include "transport/region_index.h"
#include "transport/ucx/ucx_am_wire.h"
#include "transport/ucx/ucx_landing_buffers.h"
#include "transport/ucx/ucx_resources.h"

namespace kvferry::detail {

// Something with work in the worker's turns (a peer's channel).
class UcxPumped {
 public:
  virtual ~UcxPumped() = default;
  struct Outcome {
    bool active = false;      // still has work: pump again
    bool progressed = false;  // posted or finished something: do not sleep yet
  };
  // Runs in a turn. May lower wake_at to the time it must be pumped again.
  virtual Outcome pump(Clock::time_point now, Clock::time_point& wake_at) = 0;
  // The worker is stopping: drop everything (force-close endpoints); pump finishes it.
  virtual void abandon() = 0;
};

// Waits for replies to active-message requests (in a turn).
class UcxAmClient {
 public:
  virtual ~UcxAmClient() = default;
  // A reply (kPong, kWriteAck, kReadReply) to request `h.request_id`; `data` holds its
  // `length` payload bytes for the duration of the call (a rendezvous payload is first
  // received into a buffer the worker owns). The waiter is already removed.
  virtual void on_am_reply(UcxAmId id, const UcxAmHeader& h, const void* data, size_t length) = 0;
};

// This engine's registered regions now (the target checks every request against them).
using UcxRegionSource = std::function<std::shared_ptr<const RegionIndex>()>;

// Reads UCX's configuration (UCX_TLS and the rest of the environment) and initialises a
// context with RMA, active messages and wakeup; reports its resources.
Result<UcxResources> query_ucx_resources();

class UcxWorker {
 public:
  // `rma`: enable UCP's put/get (only where this engine has hardware RMA).
  // `frame_rest_timeout`: the longest a rendezvous write may take from its header to its last
  // byte; one that takes longer lands nothing (EngineOptions::frame_rest_timeout).
  static Result<std::unique_ptr<UcxWorker>> create(
      const std::string& engine_name, UcxRegionSource regions, bool rma,
      std::chrono::milliseconds frame_rest_timeout = kDefaultFrameRestTimeout);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const UcxResources& resources() const { return resources_; }
  const std::string& address() const { return address_; }  // ucp worker address bytes

  // Runs fn in a turn (after what was posted before it).
  void post(std::function<void()> fn);
  // Posts fn and, unless a turn is running, runs one on the calling thread at once (fn in it),
  // so a small part's request leaves without waiting for the progress thread. A sleeping
  // progress thread is left asleep: the worker's event fd wakes it for the answer if nobody
  // polls for it, and its timer is set for the earliest time a channel must be pumped.
  void post_here(std::function<void()> fn);
  // Runs one turn on the calling thread unless one is running: for a thread that asks a
  // batch's state without waiting (takes in an answer that came).
  void poll_here();
  // The waiter of a part sent with post_here sleeps instead of polling (its SpinGate is
  // closed): a progress thread parked for it takes over now.
  void will_not_poll();
  // Runs fn in a turn and returns its status.
  Status call(const std::function<Status()>& fn);
  // Pumps `p` after every progress round until it reports idle (in a turn).
  void activate(std::shared_ptr<UcxPumped> p);

  // Lends the worker's turns to the constructing thread, which polls for the answer to a
  // small part: it runs turns itself (turn()) instead of waiting for the progress thread to
  // run them and then wake it. While any Driver exists the progress thread parks instead of
  // polling too, so one small op keeps two threads busy (this one and the target's), not
  // three on what may be two cores; it takes over again when the last Driver goes, and is
  // woken then if a channel still has work. A Driver lives for one polling spell (bounded).
  class Driver {
   public:
    explicit Driver(UcxWorker& worker);
    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;
    // Runs one turn on this thread unless another thread is running one. Whether it ran one
    // that progressed (a task, a UCX event, a channel's step).
    bool turn();

   private:
    UcxWorker& worker_;
    Clock::time_point wake_at_ = Clock::time_point::max();  // as its last turn reported
  };

  // Active messages (in a turn): a fresh request id whose reply goes to `client`, until the
  // reply arrives or forget_am_request.
  uint64_t expect_am_reply(UcxAmClient* client);
  void forget_am_request(uint64_t request_id);

 private:
  struct AmSend;
  struct AmReceive;
  UcxWorker() = default;
  void run();
  void wake();
  // One turn: posted tasks, UCX progress, the channels' pumps (the caller holds turn_mu_).
  // Sets `now` to after the progress and `wake_at` to when a channel must be pumped next
  // (time_point::max(): none). Whether anything progressed.
  bool turn(Clock::time_point& now, Clock::time_point& wake_at);
  // Runs a turn on the calling thread unless one is running (or this thread is in one).
  // Whether it ran; `wake_at` as turn() sets it.
  bool try_turn(Clock::time_point& wake_at, bool* progressed = nullptr);
  // After a turn on another thread: a sleeping progress thread is woken for posted tasks, or
  // has its timer set for `wake_at` while a channel has work.
  void after_turn_elsewhere(Clock::time_point wake_at);
  // The progress thread: while Drivers run the turns, and for kDriverLinger after the last
  // one left, waits (unless work is posted or left active). Whether it waited.
  bool park_while_driven();
  // With mu_ held: a parked progress thread that no Driver holds parked takes over now.
  // Whether it must be notified (unparked_).
  bool unpark_locked();
  Status set_am_handlers();
  template <UcxAmId kId>
  static ucs_status_t on_am(void* arg, const void* header, size_t header_length, void* data,
                            size_t length, const ucp_am_recv_param_t* param);
  // Target side.
  void serve_ping(const UcxAmHeader& h, ucp_ep_h reply_ep);
  ucs_status_t serve_write(const UcxAmHeader& h, void* data, size_t length, bool rndv,
                           ucp_ep_h reply_ep);
  // A rendezvous write is in (or failed): lands it if it is still wanted, and acknowledges.
  void finish_write(const AmReceive& receive, ucs_status_t status);
  void serve_read(const UcxAmHeader& h, ucp_ep_h reply_ep);
  // Sends header (and the pinned payload) on reply_ep; the pin is held until sent.
  void send_am(ucp_ep_h ep, UcxAmId id, const UcxAmHeader& h, UcxAmPin pin, size_t bytes);
  static void on_am_sent(void* request, ucs_status_t status, void* user_data);
  // Initiator side.
  ucs_status_t deliver_reply(UcxAmId id, const UcxAmHeader& h, void* data, size_t length,
                             bool rndv);
  static void on_reply_received(void* request, ucs_status_t status, size_t length, void* user_data);

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  UcxResources resources_;
  std::string address_;
  int event_fd_ = -1;  // ucp_worker_get_efd: owned by the worker
  Fd wake_fd_;         // eventfd: post() writes it
  Fd timer_fd_;        // timerfd: wakes the sleeping thread for a time others set

  std::mutex mu_;
  std::vector<std::function<void()>> tasks_;  // guarded by mu_
  bool stopping_ = false;                     // guarded by mu_
  bool asleep_ = false;      // the thread is past its last look at tasks_; guarded by mu_
  int drivers_ = 0;          // Drivers that exist; guarded by mu_
  bool parked_ = false;      // the progress thread defers to Drivers (park_while_driven); mu_
  bool unpark_now_ = false;  // work came for the parked thread; guarded by mu_
  Clock::time_point driver_left_{};  // when drivers_ last fell to 0; guarded by mu_
  // While asleep_: the earliest time the thread wakes by (its timeout, or timer_fd_).
  Clock::time_point sleep_until_ = Clock::time_point::max();  // guarded by mu_
  std::condition_variable unparked_;
  std::atomic<bool> has_active_{false};             // active_ is not empty (as of the last turn)
  std::mutex turn_mu_;                              // held for a turn, by whichever thread runs it
  bool abandoned_ = false;                          // in a turn
  std::vector<std::shared_ptr<UcxPumped>> active_;  // in a turn
  UcxRegionSource regions_;
  std::chrono::milliseconds frame_rest_timeout_ = kDefaultFrameRestTimeout;
  LogThrottle write_dropped_log_;  // rendezvous writes that failed or took too long
  uint64_t next_am_request_ = 1;   // in a turn
  std::unordered_map<uint64_t, UcxAmClient*> am_waiters_;  // in a turn
  UcxLandingBuffers landing_{kUcxLandingCacheBytes};       // in a turn
  std::thread thread_;
};

// ucs_status_t as text, for messages.
std::string ucx_status_text(ucs_status_t status);

// The send flags for `payload_bytes` of active-message data: eager up to kUcxAmEagerMaxBytes.
inline uint32_t ucx_am_payload_flags(uint64_t payload_bytes) {
  return payload_bytes != 0 && payload_bytes <= kUcxAmEagerMaxBytes ? UCP_AM_SEND_FLAG_EAGER : 0;
}

}  // namespace kvferry::detail
