// Bootstrap: how decode finds the ranks of a prefill instance (sglang's bootstrap server).
//
// One BootstrapServer per prefill instance (HTTP, cpp-httplib). Every prefill rank registers
// itself (and re-registers every heartbeat interval, which is its liveness); decode asks for
// the instance's parallel layout, then for the control endpoint of each rank it needs.
//
//   PUT /register   JSON RankRegistration            200 | 400 missing or bad field | 409 a
//                                                    change to a live rank it cannot confirm
//   GET /layout                                      200 InstanceLayout | 503 not all ranks yet
//   GET /rank?tp_rank=N[&pp_rank=&cp_rank=&dp_rank=] 200 RankRegistration | 400 | 404 | 503
//   GET /health                                      200 | 503 (a rank missing or stale)
//
// With a secret (BootstrapServerOptions::secret or KVFERRY_SECRET) every route answers 401 to
// a request that is not signed with it (pd/bootstrap_auth.h). Without one, a registration
// that changes a registered rank (its incarnation, endpoints, page size or dtype) is taken
// only when the rank itself confirms it — its control listener greets with the new
// incarnation (a restart on the same port) — or once the rank is stale or its control
// listener refuses connections (gone); 409 otherwise, naming the field and registered value.
//
// Ownership: the server owns its listener thread. BootstrapClient holds only an address.
// Thread-safety: BootstrapServer's methods are thread-safe; a BootstrapClient may be used
// from any thread (each call opens its own HTTP connection).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvferry/defaults.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"

namespace kvferry::pd {

// One prefill rank, as it registers itself.
struct RankRegistration {
  uint32_t tp_rank = 0, tp_size = 1;
  uint32_t pp_rank = 0, pp_size = 1;
  uint32_t cp_rank = 0, cp_size = 1;
  uint32_t dp_rank = 0, dp_size = 1;
  std::string control_endpoint;  // "host:port" of the rank's control listener
  std::string engine_endpoint;   // the rank's TransferEngine peer name
  uint64_t incarnation = 0;      // the rank's engine incarnation (changes on restart)
  uint32_t page_size_tokens = 0;
  uint32_t dtype_bytes = 0;
};

// The instance's parallel layout, once every rank registered.
struct InstanceLayout {
  uint32_t tp_size = 1, pp_size = 1, cp_size = 1, dp_size = 1;
  uint32_t page_size_tokens = 0;
  uint32_t dtype_bytes = 0;
};

struct RankHealth {
  uint32_t tp_rank = 0, pp_rank = 0, cp_rank = 0, dp_rank = 0;
  uint64_t incarnation = 0;
  bool alive = false;
};

struct HealthReport {
  bool healthy = false;  // every rank registered and none stale
  std::vector<RankHealth> ranks;
};

// How long the server waits for a live rank's control port to say which incarnation it is,
// before it refuses a change to that rank's registration. A PUT /register that changes a
// rank can take this long; a client waits longer.
inline constexpr std::chrono::milliseconds kRankProbeTimeout{300};

struct BootstrapServerOptions {
  std::string listen_address = "127.0.0.1:0";
  // A rank whose last registration is older than this is reported stale; 0 = never.
  std::chrono::milliseconds rank_stale_after{0};
  // Shared secret (none: KVFERRY_SECRET when set): every request must be signed with it
  // (401 otherwise; docs/PROTOCOL.md). The prefill and decode engines' secret.
  std::optional<std::string> secret;
  // Connections in total and per source; hello_timeout bounds one connection from accept to
  // its answer (one request per connection). kvferry/listener_limits.h.
  ListenerLimits limits{.max_connections = 256, .max_connections_per_source = 64};
};

class BootstrapServer {
 public:
  // Binds and starts serving. Errors: InvalidArgument (bad address), Internal (bind failed).
  static Result<std::unique_ptr<BootstrapServer>> start(BootstrapServerOptions options);
  ~BootstrapServer();
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  // "host:port" clients use.
  const std::string& address() const;
  void stop();

  class Impl;

 private:
  explicit BootstrapServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class BootstrapClient {
 public:
  // `address` is "host:port". `timeout` bounds connect, read and write of every call.
  // `secret` (none: KVFERRY_SECRET when set) signs every request.
  explicit BootstrapClient(std::string address,
                           std::chrono::milliseconds timeout = kDefaultHandshakeTimeout,
                           const std::optional<std::string>& secret = {});

  // Errors: PeerUnreachable (no answer), InvalidArgument (400), Unauthenticated (401: no or
  // another secret), OutOfRange (404, unknown rank), AlreadyExists (409: a change to a live
  // rank that it does not confirm), FailedPrecondition (503, not every rank registered yet),
  // ProtocolError (bad body).
  Status register_rank(const RankRegistration& rank) const;
  Result<InstanceLayout> layout() const;
  Result<RankRegistration> rank(uint32_t tp_rank, uint32_t pp_rank = 0, uint32_t cp_rank = 0,
                                uint32_t dp_rank = 0) const;
  Result<HealthReport> health() const;
  const std::string& address() const { return address_; }

 private:
  std::string address_;
  std::chrono::milliseconds timeout_;
  std::optional<std::string> secret_;
};

}  // namespace kvferry::pd
