// The bootstrap HTTP server (cpp-httplib: a well-kept library for a small JSON-over-HTTP
// API, so nothing here parses HTTP by hand).
#include <httplib.h>

#include <charconv>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "core/auth.h"
#include "core/logging.h"
#include "core/net.h"
#include "kvferry/pd/bootstrap.h"
#include "pd/bootstrap_auth.h"
#include "pd/bootstrap_json.h"

namespace kvferry::pd {

namespace {

constexpr int kHttpOk = 200;
constexpr int kHttpBadRequest = 400;
constexpr int kHttpUnauthorized = 401;
constexpr int kHttpConflict = 409;
// How long the server tries to reach a registered rank's control listener before it lets a
// new incarnation take the rank over (no secret).
constexpr auto kRankProbeTimeout = std::chrono::milliseconds(300);
constexpr int kHttpNotFound = 404;
constexpr int kHttpUnavailable = 503;
// A registration is a few hundred bytes; anything far larger is refused (413) unread.
constexpr size_t kMaxRequestBodyBytes = size_t{64} << 10;
constexpr auto kListenerStartTimeout = std::chrono::milliseconds(5000);

using RankKey = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;  // dp, pp, cp, tp

void reply(httplib::Response& res, int code, const nlohmann::json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

void reply_error(httplib::Response& res, int code, const std::string& message) {
  log().warn("bootstrap: HTTP {}: {}", code, message);
  reply(res, code, {{"error", message}});
}

// Parses an optional unsigned query parameter; false (with the reply sent) when malformed.
bool query_uint(const httplib::Request& req, httplib::Response& res, const char* key, bool required,
                uint32_t& out) {
  if (!req.has_param(key)) {
    if (required) reply_error(res, kHttpBadRequest, std::string("missing parameter '") + key + "'");
    return !required;
  }
  const std::string value = req.get_param_value(key);
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    reply_error(res, kHttpBadRequest,
                std::string("parameter '") + key + "' is '" + value + "', expected a number");
    return false;
  }
  return true;
}

}  // namespace

class BootstrapServer::Impl {
 public:
  explicit Impl(BootstrapServerOptions options) : options_(std::move(options)) {}
  ~Impl() { stop(); }

  Status start() {
    KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(options_.listen_address, true));
    KVF_ASSIGN_OR_RETURN(std::optional<std::string> secret, resolve_secret(options_.secret));
    if (secret) auth_.emplace(std::move(*secret));
    install_routes();
    server_.set_payload_max_length(kMaxRequestBodyBytes);
    int port = endpoint.port;
    if (port == 0) {
      port = server_.bind_to_any_port(endpoint.host);
    } else if (!server_.bind_to_port(endpoint.host, port)) {
      port = -1;
    }
    if (port <= 0) return Internal("bootstrap: cannot bind " + options_.listen_address);
    address_ = endpoint.host + ":" + std::to_string(port);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // httplib's stop() does nothing until the listener loop runs: a stop() that came sooner
    // would leave the thread serving and the join in stop() waiting forever.
    const auto deadline = Clock::now() + kListenerStartTimeout;
    while (!server_.is_running()) {
      if (Clock::now() > deadline) {
        return Internal("bootstrap: listener on " + address_ + " did not start within " +
                        std::to_string(kListenerStartTimeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return Status::Ok();
  }

  void stop() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }

  const std::string& address() const { return address_; }

 private:
  struct Registered {
    RankRegistration rank;
    Clock::time_point last_seen;
  };

  // With a secret: false (401 sent) unless the request is signed (pd/bootstrap_auth.h).
  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (!auth_) return true;
    Status s =
        auth_->check(req.method, req.target, req.body, req.get_header_value(kBootstrapAuthHeader));
    if (s.ok()) return true;
    reply_error(res, kHttpUnauthorized, req.method + " " + req.path + ": " + s.message());
    return false;
  }

  // Whether `rank` may replace `current` (same slot). A request signed with the secret may
  // (the server has one), and so may one at the same control endpoint (a heartbeat, or a
  // restart on that port); another endpoint only once the registered rank is stale or no
  // longer listening, so an unauthenticated client cannot repoint a live rank. Called
  // without mu_ held.
  Status may_replace(const Registered& current, const RankRegistration& rank) const {
    const RankRegistration& c = current.rank;
    if (auth_ || c.control_endpoint == rank.control_endpoint) {
      // Signed; or whoever now listens on the rank's control endpoint (a live rank holds its
      // port, so only a restart on that port gets here).
      return Status::Ok();
    }
    if (options_.rank_stale_after.count() > 0 &&
        Clock::now() - current.last_seen > options_.rank_stale_after) {
      return Status::Ok();
    }
    Result<Endpoint> old_endpoint = parse_endpoint(c.control_endpoint);
    if (!old_endpoint.ok() || !connect_tcp(*old_endpoint, Clock::now() + kRankProbeTimeout).ok()) {
      return Status::Ok();  // the registered rank is gone: a restart
    }
    return AlreadyExists("tp rank " + std::to_string(c.tp_rank) + " is registered by incarnation " +
                         std::to_string(c.incarnation) + ", still listening at " +
                         c.control_endpoint +
                         "; another incarnation or endpoint takes it over only once it is stale "
                         "or gone, or with the secret");
  }

  void install_routes() {
    server_.Put("/register", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      if (body.is_discarded()) return reply_error(res, kHttpBadRequest, "body is not JSON");
      Result<RankRegistration> rank = rank_from_json(body);
      if (!rank.ok()) return reply_error(res, kHttpBadRequest, rank.status().message());
      RankKey key{rank->dp_rank, rank->pp_rank, rank->cp_rank, rank->tp_rank};
      std::optional<Registered> current;
      {
        std::lock_guard lock(mu_);
        if (auto it = ranks_.find(key); it != ranks_.end()) current = it->second;
      }
      if (current) {
        if (Status may = may_replace(*current, *rank); !may.ok()) {
          return reply_error(res, kHttpConflict, may.message());
        }
      }
      std::lock_guard lock(mu_);
      if (!ranks_.empty()) {
        const RankRegistration& first = ranks_.begin()->second.rank;
        if (first.tp_size != rank->tp_size || first.pp_size != rank->pp_size ||
            first.cp_size != rank->cp_size || first.dp_size != rank->dp_size) {
          return reply_error(res, kHttpBadRequest,
                             "registration's parallel sizes differ from the instance's (tp " +
                                 std::to_string(rank->tp_size) + " vs " +
                                 std::to_string(first.tp_size) + ")");
        }
      }
      auto [it, inserted] = ranks_.insert_or_assign(key, Registered{*rank, Clock::now()});
      if (inserted) {
        log().info("bootstrap: registered tp rank {} at {}", rank->tp_rank, rank->control_endpoint);
      }
      reply(res, kHttpOk, {{"ok", true}});
    });
    server_.Get("/layout", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      std::lock_guard lock(mu_);
      if (!complete_locked()) return reply_error(res, kHttpUnavailable, waiting_message_locked());
      const RankRegistration& r = ranks_.begin()->second.rank;
      reply(res, kHttpOk,
            to_json(InstanceLayout{r.tp_size, r.pp_size, r.cp_size, r.dp_size, r.page_size_tokens,
                                   r.dtype_bytes}));
    });
    server_.Get("/rank", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      uint32_t tp = 0, pp = 0, cp = 0, dp = 0;
      if (!query_uint(req, res, "tp_rank", true, tp) ||
          !query_uint(req, res, "pp_rank", false, pp) ||
          !query_uint(req, res, "cp_rank", false, cp) ||
          !query_uint(req, res, "dp_rank", false, dp)) {
        return;
      }
      std::lock_guard lock(mu_);
      if (!ranks_.empty()) {
        const RankRegistration& first = ranks_.begin()->second.rank;
        if (tp >= first.tp_size || pp >= first.pp_size || cp >= first.cp_size ||
            dp >= first.dp_size) {
          return reply_error(res, kHttpNotFound,
                             "no rank tp " + std::to_string(tp) + " (instance tp size " +
                                 std::to_string(first.tp_size) + ")");
        }
      }
      if (!complete_locked()) return reply_error(res, kHttpUnavailable, waiting_message_locked());
      auto it = ranks_.find(RankKey{dp, pp, cp, tp});
      if (it == ranks_.end()) {
        return reply_error(res, kHttpNotFound, "no rank tp " + std::to_string(tp));
      }
      reply(res, kHttpOk, to_json(it->second.rank));
    });
    server_.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req, res)) return;
      std::lock_guard lock(mu_);
      HealthReport report;
      report.healthy = complete_locked();
      const auto now = Clock::now();
      for (const auto& [key, reg] : ranks_) {
        bool alive = options_.rank_stale_after.count() == 0 ||
                     now - reg.last_seen <= options_.rank_stale_after;
        report.healthy = report.healthy && alive;
        report.ranks.push_back({reg.rank.tp_rank, reg.rank.pp_rank, reg.rank.cp_rank,
                                reg.rank.dp_rank, reg.rank.incarnation, alive});
      }
      reply(res, report.healthy ? kHttpOk : kHttpUnavailable, to_json(report));
    });
    // Errors our handlers did not answer themselves (they log and fill the body): unknown
    // routes, and requests cpp-httplib refused before routing (a malformed request line or
    // header: 400; a body over the limit: 413).
    server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      if (res.status == kHttpNotFound) {
        return reply_error(res, kHttpNotFound, "no route " + req.method + " " + req.path);
      }
      reply_error(res, res.status,
                  "refused a malformed request (method '" + req.method + "', path '" + req.path +
                      "', " + std::to_string(req.body.size()) + " body bytes)");
    });
  }

  bool complete_locked() const {
    if (ranks_.empty()) return false;
    const RankRegistration& r = ranks_.begin()->second.rank;
    return ranks_.size() == static_cast<size_t>(r.tp_size) * r.pp_size * r.cp_size * r.dp_size;
  }

  std::string waiting_message_locked() const {
    if (ranks_.empty()) return "no prefill rank registered yet";
    const RankRegistration& r = ranks_.begin()->second.rank;
    return std::to_string(ranks_.size()) + " of " +
           std::to_string(static_cast<size_t>(r.tp_size) * r.pp_size * r.cp_size * r.dp_size) +
           " prefill ranks registered";
  }

  BootstrapServerOptions options_;
  std::optional<BootstrapAuthChecker> auth_;  // set when the server has a secret
  httplib::Server server_;
  std::thread thread_;
  std::string address_;
  std::mutex mu_;
  std::map<RankKey, Registered> ranks_;
};

Result<std::unique_ptr<BootstrapServer>> BootstrapServer::start(BootstrapServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  KVF_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<BootstrapServer>(new BootstrapServer(std::move(impl)));
}

BootstrapServer::BootstrapServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BootstrapServer::~BootstrapServer() = default;
const std::string& BootstrapServer::address() const { return impl_->address(); }
void BootstrapServer::stop() { impl_->stop(); }

}  // namespace kvferry::pd
