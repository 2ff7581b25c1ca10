#include "core/io_pool.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/fd.h"
#include "core/log_throttle.h"
#include "core/named_thread.h"

namespace kvferry {
namespace {

// The epoll data of the pool's own descriptors; watches are numbered after them.
constexpr uint64_t kTasksId = 0;
constexpr uint64_t kStopId = 1;
constexpr uint64_t kTimerId = 2;
constexpr uint64_t kFirstWatchId = 3;
constexpr uint32_t kWatchEvents = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;

Status epoll_add(int epoll, int fd, uint32_t events, uint64_t id) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD)", errno);
  }
  return Status::Ok();
}

void epoll_rearm(int epoll, int fd, uint32_t events, uint64_t id) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  ::epoll_ctl(epoll, EPOLL_CTL_MOD, fd, &ev);
}

}  // namespace

struct IoPool::State : std::enable_shared_from_this<IoPool::State> {
  Options options;
  Fd epoll;
  Fd tasks;  // eventfd (semaphore, one-shot): one count per queued task
  Fd stop;   // eventfd, written once and never read: wakes every worker, for good
  Fd timer;  // timerfd

  std::mutex mu;
  std::deque<std::function<void()>> queue;
  std::unordered_map<uint64_t, std::shared_ptr<const std::function<void()>>> watches;
  uint64_t next_watch = kFirstWatchId;
  std::function<Clock::time_point()> tick;
  Clock::time_point timer_at = Clock::time_point::max();  // what the timerfd is set to
  bool ticking = false;
  bool stopping = false;
  int threads = 0;
  int idle = 0;  // workers in epoll_wait (or about to be)
  int started = 0;
  std::unordered_map<std::thread::id, std::thread> running;
  std::vector<std::thread> ended;  // workers that retired, joined by the next start
  LogThrottle start_failures;      // threads that could not start

  // mu held. Internal when the thread cannot start (core/named_thread.h).
  Status start_worker_locked() {
    for (std::thread& t : ended) t.join();
    ended.clear();
    KVF_ASSIGN_OR_RETURN(std::thread t,
                         start_named_thread(options.name + "-" + std::to_string(started),
                                            [self = shared_from_this()] { self->run(); }));
    ++started;
    ++threads;
    ++idle;
    const std::thread::id id = t.get_id();
    running.emplace(id, std::move(t));
    return Status::Ok();
  }

  // mu held. Arms the timerfd for `at` (time_point::max(): disarmed).
  void set_timerfd_locked(Clock::time_point at) {
    timer_at = at;
    itimerspec spec{};
    if (at != Clock::time_point::max()) {
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(at.time_since_epoch()).count();
      // A time already past fires at once; zero would disarm.
      spec.it_value.tv_sec = ns <= 0 ? 0 : ns / 1'000'000'000;
      spec.it_value.tv_nsec = ns <= 0 ? 1 : ns % 1'000'000'000;
    }
    ::timerfd_settime(timer.get(), TFD_TIMER_ABSTIME, &spec, nullptr);
  }

  void run() {
    std::unique_lock lock(mu);
    for (;;) {
      const int timeout = threads > options.keep ? static_cast<int>(options.idle_exit.count()) : -1;
      lock.unlock();
      epoll_event ev{};
      const int n = ::epoll_wait(epoll.get(), &ev, 1, timeout);
      const int wait_errno = errno;
      lock.lock();
      if (n < 0 && wait_errno == EINTR) continue;
      if (n == 0 && (stopping || threads <= options.keep)) continue;
      if (n <= 0) {  // idle past idle_exit with enough others, or epoll failed: retire
        --idle;
        --threads;
        if (!stopping) {
          auto it = running.find(std::this_thread::get_id());
          ended.push_back(std::move(it->second));
          running.erase(it);
        }
        return;
      }
      --idle;
      if (idle == 0 && !stopping && threads < options.max_threads) {
        // Without another thread, the ones running take the work in turn.
        if (Status grown = start_worker_locked(); !grown.ok()) {
          start_failures.warn("{}; {} thread(s) serve the pool", grown.message(), threads);
        }
      }
      lock.unlock();
      const bool go_on = handle(ev.data.u64);
      lock.lock();
      ++idle;
      if (!go_on) {
        --idle;
        --threads;
        return;
      }
    }
  }

  // Runs what the event `id` stands for. False: the pool is stopping and nothing is left.
  bool handle(uint64_t id) {
    if (id == kTasksId || id == kStopId) {
      if (id == kTasksId) {
        // One-shot, re-armed once a count is taken: a level-triggered descriptor would wake
        // every waiting worker for each task (each finds it ready until one reads it).
        uint64_t one = 0;
        const bool took = ::read(tasks.get(), &one, sizeof(one)) == sizeof(one);
        epoll_rearm(epoll.get(), tasks.get(), EPOLLIN | EPOLLONESHOT, kTasksId);
        if (!took) return true;
      }
      std::function<void()> task;
      {
        std::lock_guard lock(mu);
        if (queue.empty()) return id != kStopId;
        task = std::move(queue.front());
        queue.pop_front();
      }
      task();
      return true;
    }
    if (id == kTimerId) {
      uint64_t expirations = 0;
      [[maybe_unused]] ssize_t r = ::read(timer.get(), &expirations, sizeof(expirations));
      std::function<Clock::time_point()> fn;
      {
        std::lock_guard lock(mu);
        fn = tick;
        ticking = true;
        timer_at = Clock::time_point::max();
      }
      Clock::time_point next = fn ? fn() : Clock::time_point::max();
      std::lock_guard lock(mu);
      ticking = false;
      // wake_timer_by during the tick recorded its time in timer_at.
      set_timerfd_locked(std::min(next, timer_at));
      epoll_rearm(epoll.get(), timer.get(), EPOLLIN | EPOLLONESHOT, kTimerId);
      return true;
    }
    std::shared_ptr<const std::function<void()>> callback;
    {
      std::lock_guard lock(mu);
      auto it = watches.find(id);
      if (it == watches.end()) return true;  // the watch is gone
      callback = it->second;
    }
    (*callback)();
    return true;
  }
};

Result<std::unique_ptr<IoPool>> IoPool::create(Options options) {
  if (options.keep < 1 || options.max_threads < options.keep) {
    return InvalidArgument("IoPool needs 1 <= keep (" + std::to_string(options.keep) +
                           ") <= max_threads (" + std::to_string(options.max_threads) + ")");
  }
  auto s = std::make_shared<State>();
  s->options = std::move(options);
  s->epoll = Fd(::epoll_create1(EPOLL_CLOEXEC));
  s->tasks = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK | EFD_SEMAPHORE));
  s->stop = Fd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  s->timer = Fd(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!s->epoll.valid() || !s->tasks.valid() || !s->stop.valid() || !s->timer.valid()) {
    return ErrnoStatus(StatusCode::kInternal, "IoPool descriptors", errno);
  }
  KVF_RETURN_IF_ERROR(epoll_add(s->epoll.get(), s->tasks.get(), EPOLLIN | EPOLLONESHOT, kTasksId));
  KVF_RETURN_IF_ERROR(epoll_add(s->epoll.get(), s->stop.get(), EPOLLIN, kStopId));
  KVF_RETURN_IF_ERROR(epoll_add(s->epoll.get(), s->timer.get(), EPOLLIN | EPOLLONESHOT, kTimerId));
  std::unique_ptr<IoPool> pool(new IoPool(s));
  Status started;
  {
    std::lock_guard lock(s->mu);
    for (int i = 0; i < s->options.keep && started.ok(); ++i) started = s->start_worker_locked();
  }
  if (!started.ok()) return started;  // the pool goes, and stops those that started
  return pool;
}

IoPool::~IoPool() {
  std::vector<std::thread> joining;
  {
    std::lock_guard lock(s_->mu);
    s_->stopping = true;
    s_->tick = nullptr;
    for (auto& [id, t] : s_->running) {
      if (id == std::this_thread::get_id()) {
        t.detach();  // destroyed by one of its own callbacks: it ends after it returns
      } else {
        joining.push_back(std::move(t));
      }
    }
    s_->running.clear();
    for (std::thread& t : s_->ended) joining.push_back(std::move(t));
    s_->ended.clear();
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(s_->stop.get(), &one, sizeof(one));
  for (std::thread& t : joining) t.join();
}

void IoPool::post(std::function<void()> task) {
  {
    std::lock_guard lock(s_->mu);
    s_->queue.push_back(std::move(task));
  }
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(s_->tasks.get(), &one, sizeof(one));
}

Result<std::unique_ptr<IoPool::Watch>> IoPool::watch(int fd, std::function<void()> on_ready) {
  uint64_t id = 0;
  {
    std::lock_guard lock(s_->mu);
    id = s_->next_watch++;
    s_->watches.emplace(id, std::make_shared<const std::function<void()>>(std::move(on_ready)));
  }
  if (Status added = epoll_add(s_->epoll.get(), fd, kWatchEvents, id); !added.ok()) {
    std::lock_guard lock(s_->mu);
    s_->watches.erase(id);
    return added;
  }
  return std::unique_ptr<Watch>(new Watch(s_, fd, id));
}

IoPool::Watch::Watch(std::shared_ptr<State> pool, int fd, uint64_t id)
    : pool_(std::move(pool)), fd_(fd), id_(id) {}

IoPool::Watch::~Watch() {
  {
    std::lock_guard lock(pool_->mu);
    pool_->watches.erase(id_);
  }
  ::epoll_ctl(pool_->epoll.get(), EPOLL_CTL_DEL, fd_, nullptr);
}

void IoPool::Watch::arm() { epoll_rearm(pool_->epoll.get(), fd_, kWatchEvents, id_); }

void IoPool::set_timer(std::function<Clock::time_point()> tick) {
  std::lock_guard lock(s_->mu);
  s_->tick = std::move(tick);
}

void IoPool::wake_timer_by(Clock::time_point when) {
  std::lock_guard lock(s_->mu);
  if (when >= s_->timer_at) return;
  if (s_->ticking) {
    s_->timer_at = when;  // applied when the tick ends
  } else {
    s_->set_timerfd_locked(when);
  }
}

int IoPool::threads() const {
  std::lock_guard lock(s_->mu);
  return s_->threads;
}

}  // namespace kvferry
