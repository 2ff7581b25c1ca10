// The bootstrap HTTP server. cpp-httplib (a well-kept library) parses requests, routes them
// and writes the answers; the connections are kvferry's own RequestServer (one epoll thread,
// core/request_server.h), because httplib's server gives each connection a pool thread that
// blocks on it: a few slow or idle clients took every thread and /health stopped answering.
// The loop only finds where a request ends (the blank line after the head, then
// Content-Length bytes) before handing the whole request to httplib in memory.
#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "core/auth.h"
#include "core/log_throttle.h"
#include "core/logging.h"
#include "core/net.h"
#include "core/request_server.h"
#include "kvferry/pd/bootstrap.h"
#include "pd/bootstrap_auth.h"
#include "pd/bootstrap_json.h"
#include "pd/control_auth.h"

namespace kvferry::pd {

namespace {

constexpr int kHttpOk = 200;
constexpr int kHttpBadRequest = 400;
constexpr int kHttpUnauthorized = 401;
constexpr int kHttpConflict = 409;
constexpr int kHttpNotFound = 404;
constexpr int kHttpUnavailable = 503;
// A registration is a few hundred bytes; anything far larger is refused (413) unread.
constexpr size_t kMaxRequestBodyBytes = size_t{64} << 10;
// The request line and headers; httplib's own limit per line is 8 KiB.
constexpr size_t kMaxRequestHeadBytes = size_t{16} << 10;
constexpr int kHttpPayloadTooLarge = 413;
constexpr int kHttpHeaderTooLarge = 431;
constexpr int kHttpLengthRequired = 411;
constexpr std::string_view kHeadEnd = "\r\n\r\n";
// Kinds of refused requests logged each with its own throttle (ErrorLog).
constexpr size_t kMaxErrorKinds = 32;

using RankKey = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;  // dp, pp, cp, tp

// A field a re-registration changes, with both values (JSON field names).
struct FieldChange {
  std::string field;
  std::string registered;
  std::string claimed;
};

// The first field of a rank's registration that `rank` changes; none for a heartbeat. The
// parallel sizes are checked against the whole instance elsewhere.
std::optional<FieldChange> first_change(const RankRegistration& current,
                                        const RankRegistration& rank) {
  auto number = [](uint64_t value) { return std::to_string(value); };
  if (rank.incarnation != current.incarnation) {
    return FieldChange{"incarnation", number(current.incarnation), number(rank.incarnation)};
  }
  if (rank.control_endpoint != current.control_endpoint) {
    return FieldChange{"control_endpoint", current.control_endpoint, rank.control_endpoint};
  }
  if (rank.engine_endpoint != current.engine_endpoint) {
    return FieldChange{"engine_endpoint", current.engine_endpoint, rank.engine_endpoint};
  }
  if (rank.page_size_tokens != current.page_size_tokens) {
    return FieldChange{"page_size", number(current.page_size_tokens),
                       number(rank.page_size_tokens)};
  }
  if (rank.dtype_bytes != current.dtype_bytes) {
    return FieldChange{"dtype_bytes", number(current.dtype_bytes), number(rank.dtype_bytes)};
  }
  return std::nullopt;
}

// The log of refused requests: a client can make them at will, so each kind (the status and
// the message up to its first quoted or variable part) costs at most a line per interval,
// without hiding the first of another kind. Past kMaxErrorKinds kinds the rest share one
// throttle. Thread-safe.
class ErrorLog {
 public:
  void warn(int code, const std::string& message) {
    LogThrottle* throttle = &overflow_;
    {
      std::lock_guard lock(mu_);
      std::string kind =
          std::to_string(code) + " " + message.substr(0, message.find_first_of("'/0123456789"));
      auto it = kinds_.find(kind);
      if (it == kinds_.end() && kinds_.size() < kMaxErrorKinds) {
        it = kinds_.emplace(std::move(kind), std::make_unique<LogThrottle>()).first;
      }
      if (it != kinds_.end()) throttle = it->second.get();
    }
    throttle->warn("bootstrap: HTTP {}: {}", code, message);
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<LogThrottle>> kinds_;  // guarded by mu_
  LogThrottle overflow_;
};

void reply(httplib::Response& res, int code, const nlohmann::json& body) {
  res.status = code;
  res.set_content(body.dump(), "application/json");
}

// Logs the error (throttled: a client can make errors at will) and sends it.
void reply_error(ErrorLog& errors_log, httplib::Response& res, int code,
                 const std::string& message) {
  errors_log.warn(code, message);
  reply(res, code, {{"error", message}});
}

// Parses an optional unsigned query parameter; false (with the reply sent) when malformed.
bool query_uint(ErrorLog& errors_log, const httplib::Request& req, httplib::Response& res,
                const char* key, bool required, uint32_t& out) {
  if (!req.has_param(key)) {
    if (required) {
      reply_error(errors_log, res, kHttpBadRequest, std::string("missing parameter '") + key + "'");
    }
    return !required;
  }
  const std::string value = req.get_param_value(key);
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), out);
  if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
    reply_error(errors_log, res, kHttpBadRequest,
                std::string("parameter '") + key + "' is '" + value + "', expected a number");
    return false;
  }
  return true;
}

// A whole answer for a request refused before httplib sees it (logged, like every error).
std::string refusal(ErrorLog& errors_log, int code, const char* reason,
                    const std::string& message) {
  errors_log.warn(code, message);
  const std::string body = nlohmann::json{{"error", message}}.dump();
  return "HTTP/1.1 " + std::to_string(code) + " " + reason +
         "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

// Where the request in `received` ends. Only framing: httplib parses it afterwards.
RequestFraming frame_http_request(std::span<const std::byte> bytes, ErrorLog& errors_log) {
  const std::string_view received(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t head_end = received.find(kHeadEnd);
  if (head_end == std::string_view::npos) {
    if (received.size() <= kMaxRequestHeadBytes) return RequestFraming::need_more();
    return RequestFraming::refuse(
        refusal(errors_log, kHttpHeaderTooLarge, "Request Header Fields Too Large",
                "request head longer than " + std::to_string(kMaxRequestHeadBytes) + " bytes"));
  }
  const std::string_view head = received.substr(0, head_end);
  uint64_t body_bytes = 0;
  for (size_t line_start = head.find("\r\n"); line_start != std::string_view::npos;) {
    line_start += 2;
    const size_t line_end = head.find("\r\n", line_start);
    const std::string_view line = head.substr(line_start, line_end - line_start);
    line_start = line_end;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // httplib refuses it with 400
    const std::string_view name = line.substr(0, colon);
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t'))
      value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (iequals(name, "Transfer-Encoding")) {
      return RequestFraming::refuse(refusal(
          errors_log, kHttpLengthRequired, "Length Required",
          "Transfer-Encoding '" + std::string(value) + "' is not served; send Content-Length"));
    }
    if (!iequals(name, "Content-Length")) continue;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), body_bytes);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
      return RequestFraming::refuse(
          refusal(errors_log, kHttpBadRequest, "Bad Request",
                  "Content-Length '" + std::string(value) + "' is not a number"));
    }
  }
  if (body_bytes > kMaxRequestBodyBytes) {
    return RequestFraming::refuse(refusal(errors_log, kHttpPayloadTooLarge, "Payload Too Large",
                                          "request body of " + std::to_string(body_bytes) +
                                              " bytes (limit " +
                                              std::to_string(kMaxRequestBodyBytes) + ")"));
  }
  const size_t whole = head_end + kHeadEnd.size() + body_bytes;
  return received.size() < whole ? RequestFraming::need_more() : RequestFraming::complete(whole);
}

// One received request for httplib to read, and the answer it writes.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(std::string_view request, std::string source)
      : request_(request), source_(std::move(source)) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, request_.size() - read_);
    std::memcpy(ptr, request_.data() + read_, n);
    read_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    answer_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = source_;
    port = 0;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip.clear();
    port = 0;
  }
  socket_t socket() const override { return INVALID_SOCKET; }
  std::string take_answer() { return std::move(answer_); }

 private:
  std::string_view request_;
  size_t read_ = 0;
  std::string source_;
  std::string answer_;
};

// httplib's routing and answers, fed one whole request at a time.
class HttpRouter : public httplib::Server {
 public:
  std::string serve(std::span<const std::byte> request, const std::string& source) {
    MemoryStream stream({reinterpret_cast<const char*>(request.data()), request.size()}, source);
    bool connection_closed = false;
    process_request(stream, /*close_connection=*/true, connection_closed, nullptr);
    return stream.take_answer();
  }
};

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
    RequestServerOptions listener;
    listener.name = "bootstrap";
    listener.limits = options_.limits;
    listener.max_request_bytes = kMaxRequestHeadBytes + kHeadEnd.size() + kMaxRequestBodyBytes;
    auto listening = RequestServer::start(
        endpoint, std::move(listener),
        [this](std::span<const std::byte> received) {
          return frame_http_request(received, errors_log_);
        },
        [this](std::span<const std::byte> request, const RequestPeer& peer) {
          return server_.serve(request, peer.source);
        });
    if (!listening.ok()) {
      return Internal("bootstrap: cannot bind " + options_.listen_address + ": " +
                      listening.status().message());
    }
    listener_ = std::move(*listening);
    address_ = listener_->endpoint().to_string();
    return Status::Ok();
  }

  void stop() {
    std::lock_guard lock(stop_mu_);
    listener_.reset();
  }

  const std::string& address() const { return address_; }

 private:
  struct Registered {
    RankRegistration rank;
    Clock::time_point last_seen;
  };

  void reply_error(httplib::Response& res, int code, const std::string& message) {
    pd::reply_error(errors_log_, res, code, message);
  }

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
  // (with a secret every request is signed), and so may one that changes nothing that
  // matters (a heartbeat). A change to a live rank's registration (incarnation, endpoints,
  // page size, dtype) is otherwise believed only from the rank itself: the server asks the
  // registered control endpoint which incarnation listens there (its AuthChallenge greets
  // with it), and accepts the change when another incarnation answers there (a restart on
  // that port, or another rank's listener on a reused port), or once the registered rank is
  // stale or its control port refuses the connection (gone). So an unauthenticated client
  // can neither repoint a live rank nor make decode believe it restarted. Called without
  // mu_ held.
  Status may_replace(const Registered& current, const RankRegistration& rank) const {
    const RankRegistration& c = current.rank;
    if (auth_) return Status::Ok();
    const std::optional<FieldChange> change = first_change(c, rank);
    if (!change) return Status::Ok();
    if (options_.rank_stale_after.count() > 0 &&
        Clock::now() - current.last_seen > options_.rank_stale_after) {
      return Status::Ok();
    }
    const auto deadline = Clock::now() + kRankProbeTimeout;
    Result<Endpoint> registered = parse_endpoint(c.control_endpoint);
    Result<Fd> connection =
        registered.ok() ? connect_tcp(*registered, deadline) : Result<Fd>(registered.status());
    if (!connection.ok()) return Status::Ok();  // the registered rank is gone: a restart
    const std::string rank_name = "tp rank " + std::to_string(c.tp_rank);
    Result<AuthChallengeMessage> greeting = read_control_challenge(
        connection->get(), rank_name + " at " + c.control_endpoint, deadline);
    if (greeting.ok() && greeting->incarnation != c.incarnation) {
      log().info(
          "bootstrap: {} at {} greets as incarnation {}, not the registered {}: the "
          "registered rank is gone ({} takes the slot)",
          rank_name, c.control_endpoint, greeting->incarnation, c.incarnation, rank.incarnation);
      return Status::Ok();
    }
    const std::string says =
        greeting.ok() ? "reports incarnation " + std::to_string(greeting->incarnation)
                      : "does not report its incarnation (" + greeting.status().message() + ")";
    return AlreadyExists(rank_name + ": the registration changes " + change->field + " to " +
                         change->claimed + ", registered " + change->registered +
                         "; the live rank at " + c.control_endpoint + " " + says +
                         ". A live rank's registration changes only with the secret, on a "
                         "restart the rank itself confirms, or once it is stale or gone");
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
      if (!query_uint(errors_log_, req, res, "tp_rank", true, tp) ||
          !query_uint(errors_log_, req, res, "pp_rank", false, pp) ||
          !query_uint(errors_log_, req, res, "cp_rank", false, cp) ||
          !query_uint(errors_log_, req, res, "dp_rank", false, dp)) {
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
    server_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
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
  HttpRouter server_;
  ErrorLog errors_log_;  // every refused request, malformed or not allowed
  std::mutex stop_mu_;
  std::unique_ptr<RequestServer> listener_;  // guarded by stop_mu_ (after start)
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
