// MetricsServer: an HTTP endpoint serving /metrics in Prometheus text format, for any
// number of metric sources (engines, PD endpoints) registered with it. Optional: nothing
// listens unless one is started.
//
// prometheus-cpp (Debian's prometheus-cpp-dev) writes the text format. The scrapes are served
// by kvferry's own one-request-per-connection listener (one epoll thread, the same limits as
// the other listeners: ListenerLimits), not by prometheus-cpp's civetweb server, whose one
// worker thread a single idle connection held for 30 s while every scrape waited. GET
// /metrics is answered; any other path 404, any other method 405; a connection that has not
// sent its request and taken its reply within limits.hello_timeout is closed. The counters
// themselves are kvferry's (relaxed atomics, kvferry/metrics.h); a scrape reads every
// source's snapshot, on the server's thread, so a source must be quick (no blocking).
//
// Ownership: a source is a callable; whatever it captures must outlive the server or be
// removed first (remove_source). Thread-safety: every method may be called concurrently
// with scrapes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kvferry/listener_limits.h"
#include "kvferry/metrics.h"
#include "kvferry/status.h"

namespace kvferry {

class RequestServer;
namespace detail {
class MetricsCollector;
}

class MetricsServer {
 public:
  using Source = std::function<MetricsSnapshot()>;

  // Listens on `address` ("host:port"; port 0 picks a free one), serving scrapes within
  // `limits` (connections in total and per source; hello_timeout, the time a connection has
  // for its request and the reply). Errors: InvalidArgument (malformed address), Internal
  // (cannot bind, naming the address).
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& address,
                                                      const ListenerLimits& limits = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "host:port" it listens on, and the URL to scrape.
  const std::string& address() const { return address_; }
  std::string url() const { return "http://" + address_ + "/metrics"; }

  // Adds a source; returns an id for remove_source.
  int add_source(Source source);
  void remove_source(int id);

 private:
  MetricsServer() = default;
  std::string address_;
  std::shared_ptr<detail::MetricsCollector> collector_;
  std::unique_ptr<RequestServer> listener_;
};

// The Prometheus text exposition format (0.0.4) of `snapshot`.
std::string to_prometheus_text(const MetricsSnapshot& snapshot);

}  // namespace kvferry
