// MetricsServer: an HTTP endpoint serving /metrics in Prometheus text format, for any
// number of metric sources (engines, PD endpoints) registered with it. Optional: nothing
// listens unless one is started.
//
// Built on prometheus-cpp (Debian's prometheus-cpp-dev): its serializer writes the text
// format and its embedded civetweb server answers the scrapes, on its own threads. The
// counters themselves are kvferry's (relaxed atomics, kvferry/metrics.h); a scrape reads
// every source's snapshot.
//
// Ownership: a source is a callable; whatever it captures must outlive the server or be
// removed first (remove_source). Thread-safety: every method may be called concurrently
// with scrapes.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kvferry/metrics.h"
#include "kvferry/status.h"

namespace prometheus {
class Exposer;
}

namespace kvferry {

namespace detail {
class MetricsCollector;
}

class MetricsServer {
 public:
  using Source = std::function<MetricsSnapshot()>;

  // Listens on `address` ("host:port"; port 0 picks a free one). Errors: InvalidArgument
  // (malformed address), Internal (cannot bind, naming the address).
  static Result<std::unique_ptr<MetricsServer>> start(const std::string& address);
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
  std::unique_ptr<prometheus::Exposer> exposer_;
};

// The Prometheus text exposition format (0.0.4) of `snapshot`.
std::string to_prometheus_text(const MetricsSnapshot& snapshot);

}  // namespace kvferry
