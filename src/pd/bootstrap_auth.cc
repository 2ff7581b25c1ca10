#include "pd/bootstrap_auth.h"

#include <charconv>
#include <cstdint>
#include <span>

#include "core/auth.h"

namespace kvferry::pd {
namespace {

constexpr size_t kNonceBytes = 16;

std::string signed_text(std::string_view method, std::string_view target, std::string_view time,
                        std::string_view nonce, std::string_view body) {
  std::string text = "kvferry-bootstrap-v1\n";
  for (std::string_view part : {method, target, time, nonce}) {
    text.append(part);
    text.push_back('\n');
  }
  text.append(body);
  return text;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::string> sign_bootstrap_request(std::string_view secret, std::string_view method,
                                           std::string_view target, std::string_view body) {
  KVF_ASSIGN_OR_RETURN(AuthNonce random, make_auth_nonce());
  const std::string nonce = to_hex(std::span<const std::byte>(random.data(), kNonceBytes));
  const std::string time = std::to_string(now_ms());
  AuthProof signature = auth_signature(secret, signed_text(method, target, time, nonce, body));
  return time + ":" + nonce + ":" + to_hex(signature);
}

Status BootstrapAuthChecker::check(std::string_view method, std::string_view target,
                                   std::string_view body, std::string_view header) {
  if (header.empty()) {
    return Unauthenticated(std::string("no ") + kBootstrapAuthHeader +
                           " header; this bootstrap server requires the secret");
  }
  const size_t first = header.find(':');
  const size_t second = first == std::string_view::npos ? first : header.find(':', first + 1);
  if (second == std::string_view::npos) {
    return Unauthenticated(std::string(kBootstrapAuthHeader) + " is not time:nonce:signature");
  }
  const std::string_view time = header.substr(0, first);
  const std::string_view nonce = header.substr(first + 1, second - first - 1);
  const std::string_view signature = header.substr(second + 1);
  int64_t sent_ms = 0;
  auto [end, ec] = std::from_chars(time.data(), time.data() + time.size(), sent_ms);
  if (ec != std::errc() || end != time.data() + time.size() || nonce.size() != 2 * kNonceBytes ||
      !from_hex(nonce)) {
    return Unauthenticated(std::string(kBootstrapAuthHeader) + " has a malformed time or nonce");
  }
  std::optional<std::string> received = from_hex(signature);
  AuthProof expected = auth_signature(secret_, signed_text(method, target, time, nonce, body));
  if (!received ||
      !auth_proof_matches(
          expected, {reinterpret_cast<const std::byte*>(received->data()), received->size()})) {
    return Unauthenticated("bad signature (wrong secret?)");
  }
  const int64_t skew_ms = now_ms() - sent_ms;
  if (skew_ms > kBootstrapAuthWindow.count() || -skew_ms > kBootstrapAuthWindow.count()) {
    return Unauthenticated("signed " + std::to_string(skew_ms) +
                           " ms away from this server's clock (window " +
                           std::to_string(kBootstrapAuthWindow.count()) + " ms)");
  }
  const auto now = WallClock::now();
  std::lock_guard lock(mu_);
  if (seen_.size() >= kMaxBootstrapNonces)
    std::erase_if(seen_, [&](const auto& e) { return e.second < now; });
  if (seen_.size() >= kMaxBootstrapNonces) {
    return Unauthenticated("too many signed requests within the window; retry later");
  }
  // Kept until the time it was signed at has left the window: a replay after that fails the
  // time check instead.
  auto forget_at = WallClock::time_point(std::chrono::milliseconds(sent_ms)) + kBootstrapAuthWindow;
  if (!seen_.emplace(std::string(nonce), forget_at).second) {
    return Unauthenticated("replayed request (nonce " + std::string(nonce) + " seen before)");
  }
  return Status::Ok();
}

}  // namespace kvferry::pd
