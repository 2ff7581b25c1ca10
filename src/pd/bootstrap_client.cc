// BootstrapClient over cpp-httplib.
#include <httplib.h>

#include "core/auth.h"
#include "core/net.h"
#include "kvferry/pd/bootstrap.h"
#include "pd/bootstrap_auth.h"
#include "pd/bootstrap_json.h"

namespace kvferry::pd {
namespace {

template <typename Duration>
void set_timeouts(httplib::Client& client, Duration timeout) {
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
}

// Maps an HTTP answer to a Status, or parses the body as JSON.
Result<nlohmann::json> to_result(const std::string& address, const std::string& what,
                                 const httplib::Result& res) {
  if (!res) {
    return PeerUnreachable("bootstrap " + address + " " + what + ": " +
                           httplib::to_string(res.error()));
  }
  auto body = nlohmann::json::parse(res->body, nullptr, false);
  std::string message = !body.is_discarded() && body.contains("error") && body["error"].is_string()
                            ? body["error"].get<std::string>()
                            : res->body;
  std::string prefix = "bootstrap " + address + " " + what + ": ";
  switch (res->status) {
    case 200: break;
    case 400: return InvalidArgument(prefix + message);
    case 401: return Unauthenticated(prefix + message);
    case 409: return AlreadyExists(prefix + message);
    case 404: return OutOfRange(prefix + message);
    case 503: return FailedPrecondition(prefix + message);
    default: return ProtocolError(prefix + "HTTP " + std::to_string(res->status) + ": " + message);
  }
  if (body.is_discarded()) return ProtocolError(prefix + "body is not JSON");
  return body;
}

// The signature header for one request; none without a secret.
Result<httplib::Headers> auth_headers(const std::optional<std::string>& secret,
                                      std::string_view method, std::string_view target,
                                      std::string_view body) {
  httplib::Headers headers;
  if (!secret) return headers;
  KVF_ASSIGN_OR_RETURN(std::string value, sign_bootstrap_request(*secret, method, target, body));
  headers.emplace(kBootstrapAuthHeader, std::move(value));
  return headers;
}

}  // namespace

BootstrapClient::BootstrapClient(std::string address, std::chrono::milliseconds timeout,
                                 const std::optional<std::string>& secret)
    : address_(std::move(address)), timeout_(timeout) {
  // An empty configured secret is refused where it is configured (the engine); here it
  // means none.
  Result<std::optional<std::string>> resolved = resolve_secret(secret);
  if (resolved.ok()) secret_ = std::move(*resolved);
}

#define KVF_BOOTSTRAP_CLIENT(client)                                  \
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint_, parse_endpoint(address_)); \
  httplib::Client client(endpoint_.host, endpoint_.port);             \
  set_timeouts(client, timeout_)

Status BootstrapClient::register_rank(const RankRegistration& rank) const {
  KVF_BOOTSTRAP_CLIENT(client);
  const std::string body = to_json(rank).dump();
  KVF_ASSIGN_OR_RETURN(httplib::Headers headers, auth_headers(secret_, "PUT", "/register", body));
  auto res = client.Put("/register", headers, body, "application/json");
  return to_result(address_, "register", res).status();
}

Result<InstanceLayout> BootstrapClient::layout() const {
  KVF_BOOTSTRAP_CLIENT(client);
  KVF_ASSIGN_OR_RETURN(httplib::Headers headers, auth_headers(secret_, "GET", "/layout", ""));
  KVF_ASSIGN_OR_RETURN(nlohmann::json body,
                       to_result(address_, "layout", client.Get("/layout", headers)));
  Result<InstanceLayout> layout = layout_from_json(body);
  if (!layout.ok())
    return ProtocolError("bootstrap " + address_ + ": " + layout.status().message());
  return layout;
}

Result<RankRegistration> BootstrapClient::rank(uint32_t tp_rank, uint32_t pp_rank, uint32_t cp_rank,
                                               uint32_t dp_rank) const {
  KVF_BOOTSTRAP_CLIENT(client);
  // The target is built here (numbers need no escaping), so what is signed is what is sent.
  const std::string target =
      "/rank?tp_rank=" + std::to_string(tp_rank) + "&pp_rank=" + std::to_string(pp_rank) +
      "&cp_rank=" + std::to_string(cp_rank) + "&dp_rank=" + std::to_string(dp_rank);
  KVF_ASSIGN_OR_RETURN(httplib::Headers headers, auth_headers(secret_, "GET", target, ""));
  KVF_ASSIGN_OR_RETURN(nlohmann::json body,
                       to_result(address_, "rank", client.Get(target, headers)));
  Result<RankRegistration> rank = rank_from_json(body);
  if (!rank.ok()) return ProtocolError("bootstrap " + address_ + ": " + rank.status().message());
  return rank;
}

Result<HealthReport> BootstrapClient::health() const {
  KVF_BOOTSTRAP_CLIENT(client);
  KVF_ASSIGN_OR_RETURN(httplib::Headers headers, auth_headers(secret_, "GET", "/health", ""));
  auto res = client.Get("/health", headers);
  if (res && res->status == 503) {
    // Unhealthy still carries the report.
    auto body = nlohmann::json::parse(res->body, nullptr, false);
    Result<HealthReport> report = health_from_json(body);
    if (report.ok()) return report;
  }
  KVF_ASSIGN_OR_RETURN(nlohmann::json body, to_result(address_, "health", res));
  Result<HealthReport> report = health_from_json(body);
  if (!report.ok())
    return ProtocolError("bootstrap " + address_ + ": " + report.status().message());
  return report;
}

}  // namespace kvferry::pd
