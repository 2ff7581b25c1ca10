#include "transport/ucx/ucx_worker.h"

#include <fmt/format.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>

#include "core/logging.h"
#include "core/named_thread.h"
#include "core/spin_gate.h"

namespace kvferry::detail {
namespace {

// The longest the progress thread sleeps while a channel has work (deadlines are checked at
// least this often even if a channel reported none).
constexpr std::chrono::milliseconds kMaxActiveSleep{100};
// After any progress (a task, an event, a channel's step) the thread keeps polling without
// sleeping for this long before it arms the worker and blocks: in a request/answer exchange
// the answer comes sooner than a sleeping thread wakes (on a VM, a halted vCPU's wake-up is
// tens of microseconds: docs/TRANSPORTS.md, "tcp lanes"). Bounded, so an idle worker sleeps;
// and not while polling does not pay (SpinGate: a contended core, or spells that found
// nothing).
constexpr std::chrono::microseconds kHotTime{100};
// How long the progress thread stays parked after the last Driver left, for the next one: a
// sequence of small ops has a Driver each, and waking the thread between them (to watch the
// worker's event fd, which the next op's answer then fires) would put a third thread on the
// cores the two polling ends need. Work posted meanwhile unparks it at once; an event for this
// worker as a target waits at most this long.
constexpr std::chrono::milliseconds kDriverLinger{1};
// How long the destructor lets channels finish closing their endpoints.
constexpr std::chrono::seconds kCloseGrace{2};

// ucp_context_print_info's text (the resource list), through a memory stream.
std::string printed_context_info(ucp_context_h context) {
  char* text = nullptr;
  size_t size = 0;
  FILE* stream = ::open_memstream(&text, &size);
  if (stream == nullptr) return "";
  ucp_context_print_info(context, stream);
  std::fclose(stream);
  std::string out(text, size);
  std::free(text);
  return out;
}

// `rma`: UCP's put/get (with their emulated handlers, which check nothing, on a worker
// reached over tcp or shared memory) only where this engine has hardware RMA and may use
// the kRma path; otherwise kvferry's active messages alone move bytes.
Result<ucp_context_h> init_context(std::string_view name, bool rma) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return Internal("ucx: reading UCX's configuration: " + ucx_status_text(s));
  std::string context_name(name);
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (rma ? UCP_FEATURE_RMA : 0);
  params.name = context_name.c_str();
  ucp_context_h context = nullptr;
  s = ucp_init(&params, config, &context);
  ucp_config_release(config);
  if (s != UCS_OK) return NotSupported("ucx: ucp_init failed: " + ucx_status_text(s));
  return context;
}

UcxResources resources_of(ucp_context_h context) {
  UcxResources r;
  r.transports = parse_ucx_resource_lines(printed_context_info(context));
  r.hardware_rma = std::any_of(r.transports.begin(), r.transports.end(),
                               [](const std::string& t) { return is_hardware_rma_transport(t); });
  ucp_context_attr_t attr{};
  attr.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES;
  if (ucp_context_query(context, &attr) == UCS_OK) {
    r.cuda_memory = (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)) != 0;
  }
  return r;
}

}  // namespace

std::string ucx_status_text(ucs_status_t status) {
  return fmt::format("{} ({})", ucs_status_string(status), static_cast<int>(status));
}

Result<UcxResources> query_ucx_resources() {
  KVF_ASSIGN_OR_RETURN(ucp_context_h context, init_context("kvferry-probe", true));
  UcxResources r = resources_of(context);
  ucp_cleanup(context);
  return r;
}

Result<std::unique_ptr<UcxWorker>> UcxWorker::create(const std::string& engine_name,
                                                     UcxRegionSource regions, bool rma,
                                                     std::chrono::milliseconds frame_rest_timeout) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  w->regions_ = std::move(regions);
  w->frame_rest_timeout_ = frame_rest_timeout;
  KVF_ASSIGN_OR_RETURN(w->context_, init_context(engine_name, rma));
  w->resources_ = resources_of(w->context_);
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one turn at a time, on any thread
  ucs_status_t s = ucp_worker_create(w->context_, &params, &w->worker_);
  if (s != UCS_OK) return Internal("ucx: ucp_worker_create failed: " + ucx_status_text(s));
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  s = ucp_worker_get_address(w->worker_, &address, &address_bytes);
  if (s != UCS_OK) return Internal("ucx: ucp_worker_get_address failed: " + ucx_status_text(s));
  w->address_.assign(reinterpret_cast<const char*>(address), address_bytes);
  ucp_worker_release_address(w->worker_, address);
  KVF_RETURN_IF_ERROR(w->set_am_handlers());
  s = ucp_worker_get_efd(w->worker_, &w->event_fd_);
  if (s != UCS_OK) return Internal("ucx: ucp_worker_get_efd failed: " + ucx_status_text(s));
  int wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake < 0) return Internal(fmt::format("ucx: eventfd: {}", std::strerror(errno)));
  w->wake_fd_ = Fd(wake);
  int timer = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (timer < 0) return Internal(fmt::format("ucx: timerfd_create: {}", std::strerror(errno)));
  w->timer_fd_ = Fd(timer);
  KVF_ASSIGN_OR_RETURN(w->thread_, start_named_thread("kvf-ucx", [raw = w.get()] { raw->run(); }));
  return w;
}

UcxWorker::~UcxWorker() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    wake();
    unparked_.notify_one();
    thread_.join();
  }
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  if (context_ != nullptr) ucp_cleanup(context_);
}

void UcxWorker::wake() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_fd_.get(), &one, sizeof(one));
}

void UcxWorker::post(std::function<void()> fn) {
  bool asleep = false;
  bool unpark = false;
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(fn));
    asleep = asleep_;
    // A Driver takes it in its next turn; without one, the parked thread does.
    unpark = unpark_locked();
  }
  if (asleep) wake();  // a polling thread takes it in its next round
  if (unpark) unparked_.notify_one();
}

void UcxWorker::will_not_poll() {
  bool unpark = false;
  {
    std::lock_guard lock(mu_);
    unpark = unpark_locked();
  }
  if (unpark) unparked_.notify_one();
}

void UcxWorker::poll_here() {
  Clock::time_point wake_at;
  if (try_turn(wake_at)) after_turn_elsewhere(wake_at);
}

void UcxWorker::post_here(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(fn));
  }
  // Not run here: the thread in a turn takes it in its next one, or (the progress thread)
  // sees it before it sleeps; a Driver that leaves first hands it on (~Driver).
  poll_here();
}

Status UcxWorker::call(const std::function<Status()>& fn) {
  std::promise<Status> done;
  std::future<Status> result = done.get_future();
  post([&fn, &done] { done.set_value(fn()); });
  return result.get();
}

void UcxWorker::activate(std::shared_ptr<UcxPumped> p) {
  if (std::find(active_.begin(), active_.end(), p) == active_.end()) {
    active_.push_back(std::move(p));
  }
  has_active_.store(true);
}

uint64_t UcxWorker::expect_am_reply(UcxAmClient* client) {
  const uint64_t id = next_am_request_++;
  am_waiters_.emplace(id, client);
  return id;
}

void UcxWorker::forget_am_request(uint64_t request_id) { am_waiters_.erase(request_id); }

UcxWorker::Driver::Driver(UcxWorker& worker) : worker_(worker) {
  std::lock_guard lock(worker_.mu_);
  ++worker_.drivers_;
}

UcxWorker::Driver::~Driver() {
  bool unpark = false;
  bool last = false;
  {
    std::lock_guard lock(worker_.mu_);
    if (--worker_.drivers_ == 0) {
      last = true;
      worker_.driver_left_ = Clock::now();
      // Parked, the progress thread lingers for the next Driver, unless there is work now.
      unpark = (!worker_.tasks_.empty() || worker_.has_active_.load()) && worker_.unpark_locked();
    }
  }
  if (unpark) worker_.unparked_.notify_one();
  if (last) worker_.after_turn_elsewhere(wake_at_);
}

bool UcxWorker::Driver::turn() {
  bool progressed = false;
  worker_.try_turn(wake_at_, &progressed);
  return progressed;
}

namespace {
// The worker whose turn this thread is running, if any (its turn_mu_ is held).
thread_local const UcxWorker* t_turning = nullptr;
}  // namespace

bool UcxWorker::try_turn(Clock::time_point& wake_at, bool* progressed) {
  if (t_turning == this) return false;
  std::unique_lock lock(turn_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  t_turning = this;
  Clock::time_point now;
  const bool moved = turn(now, wake_at);
  t_turning = nullptr;
  if (progressed != nullptr) *progressed = moved;
  return true;
}

void UcxWorker::after_turn_elsewhere(Clock::time_point wake_at) {
  bool asleep = false;
  bool wake_now = false;
  bool unpark = false;
  Clock::time_point timer_at = Clock::time_point::max();
  {
    std::lock_guard lock(mu_);
    if (parked_) {
      unpark = !tasks_.empty() && unpark_locked();
      // Lingering: it stays parked for the answer's waiter (the next Driver), and no longer
      // than kDriverLinger from here if none comes.
      if (!unpark) driver_left_ = std::max(driver_left_, Clock::now());
    } else if (asleep_) {
      asleep = true;
      if (!tasks_.empty()) {
        wake_now = true;
      } else if (has_active_.load()) {
        // Its sleep was timed before the turns here set channels working.
        timer_at = std::min(wake_at, Clock::now() + kMaxActiveSleep);
        if (timer_at < sleep_until_) {
          sleep_until_ = timer_at;
        } else {
          timer_at = Clock::time_point::max();
        }
      }
    }
  }
  if (unpark) unparked_.notify_one();
  if (asleep && !wake_now) {
    // The sleeping thread counts on the worker being armed, and a turn here may have used
    // that up (an armed interface signals its next event once): armed again, or, with events
    // pending, the thread is woken for them. Someone else in a turn re-arms after it.
    std::unique_lock turn(turn_mu_, std::try_to_lock);
    if (turn.owns_lock()) wake_now = ucp_worker_arm(worker_) == UCS_ERR_BUSY;
  }
  if (wake_now) {
    wake();
  } else if (timer_at != Clock::time_point::max()) {
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(timer_at.time_since_epoch()).count();
    itimerspec when{};
    when.it_value.tv_sec = static_cast<time_t>(ns / 1000000000);
    when.it_value.tv_nsec = static_cast<long>(ns % 1000000000);
    ::timerfd_settime(timer_fd_.get(), TFD_TIMER_ABSTIME, &when, nullptr);
  }
}

bool UcxWorker::turn(Clock::time_point& now, Clock::time_point& wake_at) {
  wake_at = Clock::time_point::max();
  std::vector<std::function<void()>> tasks;
  bool stopping = false;
  {
    std::lock_guard lock(mu_);
    tasks.swap(tasks_);
    stopping = stopping_;
  }
  for (auto& task : tasks) task();
  if (stopping && !abandoned_) {
    abandoned_ = true;
    for (const auto& p : active_) p->abandon();
  }
  bool progressed = !tasks.empty();
  while (ucp_worker_progress(worker_) != 0) progressed = true;
  now = Clock::now();
  wake_at = landing_.release_if_idle(now);
  for (size_t i = 0; i < active_.size();) {
    UcxPumped::Outcome o = active_[i]->pump(now, wake_at);
    progressed = progressed || o.progressed;
    if (o.active) {
      ++i;
    } else {
      active_.erase(active_.begin() + static_cast<ptrdiff_t>(i));
    }
  }
  has_active_.store(!active_.empty());
  return progressed;
}

bool UcxWorker::unpark_locked() {
  if (!parked_ || drivers_ > 0 || unpark_now_) return false;
  unpark_now_ = true;
  return true;
}

bool UcxWorker::park_while_driven() {
  std::unique_lock lock(mu_);
  if (drivers_ == 0) return false;
  parked_ = true;
  for (;;) {
    if (stopping_ || unpark_now_) break;
    const Clock::time_point now = Clock::now();
    if (drivers_ == 0 && now >= driver_left_ + kDriverLinger) break;
    unparked_.wait_until(lock, (drivers_ > 0 ? now : driver_left_) + kDriverLinger);
  }
  parked_ = false;
  unpark_now_ = false;
  return true;
}

void UcxWorker::run() {
  ::pthread_setname_np(::pthread_self(), "kvf-ucx");
  std::optional<Clock::time_point> stop_by;
  SpinGate spin;  // polls only while polling pays (core/spin_gate.h)
  for (;;) {
    // A Driver polls for the answer: polling too would only take a core it needs.
    if (park_while_driven()) spin.stop();
    std::unique_lock turn_lock(turn_mu_);
    const Clock::time_point began = Clock::now();
    Clock::time_point now;
    Clock::time_point wake_at;
    t_turning = this;
    const bool progressed = turn(now, wake_at);
    t_turning = nullptr;
    if (abandoned_ && !stop_by) stop_by = now + kCloseGrace;
    if (stop_by && (active_.empty() || now > *stop_by)) {
      if (!active_.empty()) {
        log().warn("ucx: {} peer channel(s) still closing at shutdown", active_.size());
      }
      active_.clear();
      return;
    }
    if (progressed) {
      spin.settle();
      spin.open(now, kHotTime);
      continue;
    }
    if (spin.spinning()) {
      turn_lock.unlock();  // a Driver may take the next turn meanwhile
      if (spin.keep_polling(began, now)) continue;
      turn_lock.lock();
    }
    if (ucp_worker_arm(worker_) == UCS_ERR_BUSY) continue;
    if (!active_.empty()) wake_at = std::min(wake_at, now + kMaxActiveSleep);
    {
      std::lock_guard lock(mu_);
      if (!tasks_.empty() || drivers_ > 0) continue;
      asleep_ = true;  // from here on, post() wakes the thread
      sleep_until_ = wake_at;
    }
    turn_lock.unlock();
    int timeout_ms = -1;
    if (wake_at != Clock::time_point::max()) {
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, kMaxActiveSleep.count()));
    }
    pollfd fds[3] = {
        {event_fd_, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}, {timer_fd_.get(), POLLIN, 0}};
    ::poll(fds, 3, timeout_ms);
    for (int i = 1; i < 3; ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      uint64_t n = 0;
      [[maybe_unused]] ssize_t r = ::read(fds[i].fd, &n, sizeof(n));
    }
    std::lock_guard lock(mu_);
    asleep_ = false;
    sleep_until_ = Clock::time_point::max();
  }
}

}  // namespace kvferry::detail
