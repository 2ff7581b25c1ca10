// TcpServer: the receiving side of the tcp transport. Accepts data connections and serves
// them on a few I/O threads with epoll (non-blocking sockets, level-triggered), each started
// with the first connection it is given.
//
// For a kWrite it checks, before reading any payload, that the whole target range lies in
// one registered region, pins that region (so it cannot be unregistered mid-write), and
// reads the payload straight into it; it acknowledges only once every byte is in place.
// A range outside registered memory is refused: its payload is drained into a scratch
// buffer and acknowledged with NotRegistered. A kWrite into device memory is received into a
// pinned buffer of the I/O thread's and copied to the device (TcpDeviceLander) before it is
// acknowledged. A request's bytes are never written after
// its deadline (they are drained instead and acknowledged with Timeout). kRead is served
// from registered memory the same way; a kRead of device memory is staged device -> pinned
// first (TcpDeviceReadStager) and answered, whole or with an error status, once staged. A
// vector frame (kWriteV / kReadV) has every entry of its table checked (host memory only)
// and each region pinned before any byte lands; one bad entry refuses it whole, the reply
// naming that entry's address.
//
// Thread-safety: constructed and destroyed by the engine; the region source is called
// from the I/O threads and must be thread-safe.
//
// Bounded per connection (TcpServerOptions, docs/PROTOCOL.md "Listener limits"): the
// acceptor's connection limits; the hello (and authentication) within
// limits.hello_timeout; an idle connection closed after limits.idle_timeout; at most
// max_queued_replies replies queued, after which the connection is not read until the peer
// takes some; a request whose payload stops coming (deadline or not), or a reply the peer
// does not take, closes the connection after stall_timeout; and a frame that is not complete
// frame_rest_timeout after its first byte arrived closes it too, however its bytes trickle in
// (one byte just before each stall_timeout would otherwise hold its pin for ever). So no pin
// outlives its frame by more than frame_rest_timeout.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/acceptor.h"
#include "core/fd.h"
#include "core/log_throttle.h"
#include "core/net.h"
#include "kvferry/defaults.h"
#include "kvferry/listener_limits.h"
#include "transport/region_index.h"
#include "transport/tcp/tcp_staging_pool.h"

namespace kvferry {

class TcpDeviceReadService;

struct TcpServerOptions {
  Endpoint listen;
  int io_threads = 2;
  uint64_t incarnation = 0;
  std::optional<std::string> secret;  // authentication on when set
  ListenerLimits limits{.idle_timeout = std::chrono::minutes(5)};
  uint32_t max_queued_replies = 1024;
  std::chrono::milliseconds stall_timeout{10'000};
  // The longest one frame may take from its first byte to its last (EngineOptions).
  std::chrono::milliseconds frame_rest_timeout = kDefaultFrameRestTimeout;
  // Device memory staging (writes into and reads of device regions); null: refused.
  std::shared_ptr<TcpDeviceStaging> device;
};

class TcpServer {
 public:
  using RegionSource = std::function<std::shared_ptr<const RegionIndex>()>;

  static Result<std::unique_ptr<TcpServer>> start(const TcpServerOptions& options,
                                                  RegionSource regions);
  ~TcpServer();
  TcpServer(const TcpServer&) = delete;
  TcpServer& operator=(const TcpServer&) = delete;

  const Endpoint& endpoint() const;
  // Connections open now (for tests and diagnostics).
  uint32_t open_connections() const { return acceptor_->open_connections(); }

 private:
  struct IoThread;
  TcpServer(const TcpServerOptions& options, RegionSource regions,
            std::unique_ptr<Acceptor> acceptor);

  // The I/O thread the next connection goes to, started on first use: an engine no peer
  // reaches over tcp runs none (accept thread only). Null when it cannot start.
  IoThread* io_for_next_connection();

  TcpServerOptions options_;
  RegionSource regions_;
  std::shared_ptr<TcpDeviceReadService> reads_;  // shared by the I/O threads
  std::unique_ptr<Acceptor> acceptor_;
  std::vector<std::unique_ptr<IoThread>> io_;  // null until started
  size_t next_io_ = 0;                         // accept thread only
  LogThrottle start_failures_;                 // I/O threads that could not start
};

}  // namespace kvferry
