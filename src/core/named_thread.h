// Every thread kvferry starts carries a name, so that `top -H`, `ps -T` and gdb tell its
// threads apart from each other and from the host process's own (which they would otherwise
// all share: "python3"). Names start with "kvf-" and are at most 15 characters (the kernel's
// limit; longer ones are cut), e.g. kvf-tcp-rx, kvf-copy-1, kvf-notify.
#pragma once

#include <pthread.h>

#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "kvferry/status.h"

namespace kvferry {

inline void name_this_thread(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

// `prefix` + `what` with spaces as dashes, cut to the kernel's 15 characters
// ("kvf-r-" + "bootstrap http" = "kvf-r-bootstrap").
inline std::string thread_name(std::string prefix, const std::string& what) {
  for (char c : what) prefix.push_back(c == ' ' ? '-' : c);
  return prefix.substr(0, 15);
}

// std::thread running `body` under `name`. Throws std::system_error when the system will not
// start a thread; only for threads that start with the object that owns them, whose
// factory turns that into a Status (see start_named_thread).
template <typename Body>
std::thread named_thread(std::string name, Body&& body) {
  return std::thread([name = std::move(name), body = std::forward<Body>(body)]() mutable {
    name_this_thread(name);
    body();
  });
}

namespace detail {
struct ThreadStartRefusals {
  std::mutex mu;
  int left = 0;        // guarded by mu
  std::string prefix;  // guarded by mu: names the refusals apply to
};
inline ThreadStartRefusals thread_start_refusals;
// Takes one of the refusals a test asked for, if one is left for `name`.
inline bool take_thread_start_refusal(const std::string& name) {
  ThreadStartRefusals& r = thread_start_refusals;
  std::lock_guard lock(r.mu);
  if (r.left == 0 || name.rfind(r.prefix, 0) != 0) return false;
  --r.left;
  return true;
}
}  // namespace detail

// Test seam: the next `n` start_named_thread calls of this process for a thread whose name
// starts with `prefix` fail as if the system had refused them (tests of exhaustion).
inline void refuse_next_thread_starts(int n, std::string prefix = "") {
  std::lock_guard lock(detail::thread_start_refusals.mu);
  detail::thread_start_refusals.left = n;
  detail::thread_start_refusals.prefix = std::move(prefix);
}

// Test seam: how many of the refusals asked for are still to come.
inline int thread_start_refusals_left() {
  std::lock_guard lock(detail::thread_start_refusals.mu);
  return detail::thread_start_refusals.left;
}

// named_thread, or Internal naming the thread when the system will not start one (out of
// tasks: RLIMIT_NPROC or a cgroup's pids.max; out of memory for its stack). For threads
// started later than their owner, on behalf of a peer or a request: exhaustion then fails
// that one call, not the process.
template <typename Body>
Result<std::thread> start_named_thread(std::string name, Body&& body) {
  std::error_code refused = std::make_error_code(std::errc::resource_unavailable_try_again);
  if (!detail::take_thread_start_refusal(name)) {
    try {
      return named_thread(name, std::forward<Body>(body));
    } catch (const std::system_error& e) {
      refused = e.code();
    }
  }
  return Internal("cannot start thread " + name + ": " + refused.message());
}

}  // namespace kvferry
