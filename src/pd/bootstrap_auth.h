// Signed bootstrap HTTP requests (docs/PROTOCOL.md, "Bootstrap HTTP routes").
//
// With a secret, every request carries the header
//
//   X-Kvferry-Auth: <unix time ms>:<nonce, 32 hex digits>:<signature, 64 hex digits>
//
// where signature = HMAC-SHA256(secret, "kvferry-bootstrap-v1\n" method "\n" target "\n"
// time "\n" nonce "\n" body) and target is the request target as sent (path and query). The
// server refuses (401) a request without it, with a bad signature, with a time more than
// kBootstrapAuthWindow away from its own clock, or with a nonce it has seen within that
// window (a replay). HTTP has no connection to run a challenge over, so a time and a nonce
// stand in for the challenge: hosts' clocks must agree within the window (NTP).
//
// Thread-safety: sign_bootstrap_request is pure; BootstrapAuthChecker is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry::pd {

inline constexpr const char* kBootstrapAuthHeader = "X-Kvferry-Auth";
inline constexpr std::chrono::milliseconds kBootstrapAuthWindow{30'000};
// Nonces remembered at most (one window's worth of requests); beyond it, requests are refused
// until old ones expire.
inline constexpr size_t kMaxBootstrapNonces = 1u << 16;

// The header value for one request, at the current time with a fresh nonce.
Result<std::string> sign_bootstrap_request(std::string_view secret, std::string_view method,
                                           std::string_view target, std::string_view body);

class BootstrapAuthChecker {
 public:
  explicit BootstrapAuthChecker(std::string secret) : secret_(std::move(secret)) {}
  // OK when `header` (empty: absent) signs this request; Unauthenticated naming why not.
  Status check(std::string_view method, std::string_view target, std::string_view body,
               std::string_view header);

 private:
  using WallClock = std::chrono::system_clock;
  std::string secret_;
  std::mutex mu_;
  std::map<std::string, WallClock::time_point> seen_;  // nonce -> when it may be forgotten
};

}  // namespace kvferry::pd
