// UcxWorker: one engine's UCX context and worker, and the one progress thread that owns
// the worker. Every UCX call on the worker (endpoints, put/get, flush, close, memory
// registration) runs on that thread; other threads hand it work (post, call). The thread
// sleeps on the worker's event fd (ucp_worker_arm) and an eventfd of its own, so an idle
// engine does not spin; it also runs on the passive side, where UCX's emulated put/get are
// served by the target's worker.
//
// Channels with work (UcxPumped) are pumped after every progress round until they report
// idle; the thread wakes for the earliest deadline any of them reports.
//
// Ownership: the transport owns the worker; channels are kept alive by the active set while
// they have work. The destructor stops the thread after letting channels close (bounded).
//
// Thread-safety: post and call from any thread except the progress thread (call would wait
// for itself); context() and the read-only accessors from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/net.h"
#include "kvferry/status.h"
#include "transport/ucx/ucx_resources.h"

namespace kvferry::detail {

// Something with work on the progress thread (a peer's channel).
class UcxPumped {
 public:
  virtual ~UcxPumped() = default;
  struct Outcome {
    bool active = false;      // still has work: pump again
    bool progressed = false;  // posted or finished something: do not sleep yet
  };
  // Runs on the progress thread. May lower wake_at to the time it must be pumped again.
  virtual Outcome pump(Clock::time_point now, Clock::time_point& wake_at) = 0;
  // The worker is stopping: drop everything (force-close endpoints); pump finishes it.
  virtual void abandon() = 0;
};

// Reads UCX's configuration (UCX_TLS and the rest of the environment) and initialises a
// context with RMA and wakeup; reports its resources.
Result<UcxResources> query_ucx_resources();

class UcxWorker {
 public:
  static Result<std::unique_ptr<UcxWorker>> create(const std::string& engine_name);
  ~UcxWorker();
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  const UcxResources& resources() const { return resources_; }
  const std::string& address() const { return address_; }  // ucp worker address bytes

  // Runs fn on the progress thread (after what was posted before it).
  void post(std::function<void()> fn);
  // Runs fn on the progress thread and returns its status.
  Status call(const std::function<Status()>& fn);
  // Pumps `p` after every progress round until it reports idle (progress thread only).
  void activate(std::shared_ptr<UcxPumped> p);

 private:
  UcxWorker() = default;
  void run();
  void wake();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  UcxResources resources_;
  std::string address_;
  int event_fd_ = -1;  // ucp_worker_get_efd: owned by the worker
  Fd wake_fd_;         // eventfd: post() writes it

  std::mutex mu_;
  std::vector<std::function<void()>> tasks_;        // guarded by mu_
  bool stopping_ = false;                           // guarded by mu_
  std::vector<std::shared_ptr<UcxPumped>> active_;  // progress thread only
  std::thread thread_;
};

// ucs_status_t as text, for messages.
std::string ucx_status_text(ucs_status_t status);

}  // namespace kvferry::detail
