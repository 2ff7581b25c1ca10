// Every thread kvferry starts carries a name, so that `top -H`, `ps -T` and gdb tell its
// threads apart from each other and from the host process's own (which they would otherwise
// all share: "python3"). Names start with "kvf-" and are at most 15 characters (the kernel's
// limit; longer ones are cut), e.g. kvf-tcp-rx, kvf-copy-1, kvf-notify.
#pragma once

#include <pthread.h>

#include <string>
#include <thread>
#include <utility>

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

// std::thread running `body` under `name`.
template <typename Body>
std::thread named_thread(std::string name, Body&& body) {
  return std::thread([name = std::move(name), body = std::forward<Body>(body)]() mutable {
    name_this_thread(name);
    body();
  });
}

}  // namespace kvferry
