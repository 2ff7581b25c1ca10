#include "kvferry/metrics_server.h"

#include <fmt/format.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string_view>

#include "core/net.h"
#include "core/request_server.h"

namespace kvferry {
namespace detail {

prometheus::MetricType to_prometheus(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return prometheus::MetricType::Counter;
    case MetricType::kGauge: return prometheus::MetricType::Gauge;
    case MetricType::kHistogram: return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

std::vector<prometheus::MetricFamily> to_prometheus(const MetricsSnapshot& snapshot) {
  std::vector<prometheus::MetricFamily> out;
  out.reserve(snapshot.families.size());
  for (const MetricFamily& f : snapshot.families) {
    prometheus::MetricFamily family;
    family.name = f.name;
    family.help = f.help;
    family.type = to_prometheus(f.type);
    for (const MetricPoint& p : f.points) {
      prometheus::ClientMetric m;
      for (const auto& [key, value] : p.labels) m.label.push_back({key, value});
      switch (f.type) {
        case MetricType::kCounter: m.counter.value = p.value; break;
        case MetricType::kGauge: m.gauge.value = p.value; break;
        case MetricType::kHistogram:
          m.histogram.sample_count = p.count;
          m.histogram.sample_sum = p.sum;
          for (size_t i = 0; i < f.bucket_bounds.size() && i < p.cumulative_counts.size(); ++i) {
            m.histogram.bucket.push_back({p.cumulative_counts[i], f.bucket_bounds[i]});
          }
          m.histogram.bucket.push_back({p.count, std::numeric_limits<double>::infinity()});
          break;
      }
      family.metric.push_back(std::move(m));
    }
    out.push_back(std::move(family));
  }
  return out;
}

// The sources of one server, read at every scrape (on the server's thread).
class MetricsCollector {
 public:
  int add(MetricsServer::Source source) {
    std::lock_guard lock(mu_);
    sources_.emplace(next_id_, std::move(source));
    return next_id_++;
  }
  void remove(int id) {
    std::lock_guard lock(mu_);
    sources_.erase(id);
  }
  MetricsSnapshot collect() const {
    MetricsSnapshot all;
    std::lock_guard lock(mu_);
    for (const auto& [id, source] : sources_) all.merge(source());
    return all;
  }

 private:
  mutable std::mutex mu_;
  std::map<int, MetricsServer::Source> sources_;  // guarded by mu_
  int next_id_ = 1;                               // guarded by mu_
};

}  // namespace detail

namespace {

// A scrape is one GET whose request line is all that matters; parsing that by hand is a few
// lines, where serving it through an HTTP library would take an in-memory stream adapter
// around the epoll loop (the bootstrap server's is private to it).
constexpr std::string_view kHeadEnd = "\r\n\r\n";
constexpr std::string_view kLineEnd = "\r\n";
// A request line and the headers Prometheus sends take a few hundred bytes.
constexpr size_t kMaxRequestHeadBytes = size_t{8} << 10;
constexpr std::string_view kMetricsPath = "/metrics";
constexpr std::string_view kTextFormat = "text/plain; version=0.0.4; charset=utf-8";

enum class HttpStatus : int {
  kOk = 200,
  kBadRequest = 400,
  kNotFound = 404,
  kMethodNotAllowed = 405,
  kHeaderTooLarge = 431,
};

std::string_view reason_phrase(HttpStatus status) {
  switch (status) {
    case HttpStatus::kOk: return "OK";
    case HttpStatus::kBadRequest: return "Bad Request";
    case HttpStatus::kNotFound: return "Not Found";
    case HttpStatus::kMethodNotAllowed: return "Method Not Allowed";
    case HttpStatus::kHeaderTooLarge: return "Request Header Fields Too Large";
  }
  return "Error";
}

std::string http_answer(HttpStatus status, std::string_view content_type, std::string_view body) {
  std::string extra = status == HttpStatus::kMethodNotAllowed ? "Allow: GET\r\n" : "";
  return fmt::format(
      "HTTP/1.1 {} {}\r\n{}Content-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
      static_cast<int>(status), reason_phrase(status), extra, content_type, body.size(), body);
}

std::string http_error(HttpStatus status, std::string_view message) {
  return http_answer(status, "text/plain; charset=utf-8", std::string(message) + "\n");
}

// The request ends at its head: a scrape has no body (what follows is discarded unread).
RequestFraming frame_scrape(std::span<const std::byte> bytes) {
  const std::string_view received(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const size_t head_end = received.find(kHeadEnd);
  if (head_end != std::string_view::npos) {
    return RequestFraming::complete(head_end + kHeadEnd.size());
  }
  if (received.size() <= kMaxRequestHeadBytes) return RequestFraming::need_more();
  return RequestFraming::refuse(
      http_error(HttpStatus::kHeaderTooLarge,
                 fmt::format("request head longer than {} bytes", kMaxRequestHeadBytes)));
}

std::string answer_scrape(std::span<const std::byte> request,
                          const detail::MetricsCollector& collector) {
  const std::string_view head(reinterpret_cast<const char*>(request.data()), request.size());
  // "METHOD SP target SP HTTP/x.y"
  const std::string_view line = head.substr(0, head.find(kLineEnd));
  const size_t method_end = line.find(' ');
  const size_t target_end =
      line.find(' ', method_end == std::string_view::npos ? 0 : method_end + 1);
  if (method_end == std::string_view::npos || target_end == std::string_view::npos ||
      !line.substr(target_end + 1).starts_with("HTTP/")) {
    return http_error(HttpStatus::kBadRequest, "malformed request line");
  }
  const std::string_view method = line.substr(0, method_end);
  const std::string_view target = line.substr(method_end + 1, target_end - method_end - 1);
  if (method != "GET") {
    return http_error(HttpStatus::kMethodNotAllowed,
                      fmt::format("method {} (only GET is served)", method));
  }
  if (target.substr(0, target.find('?')) != kMetricsPath) {
    return http_error(HttpStatus::kNotFound,
                      fmt::format("{} (metrics are at {})", target.substr(0, 200), kMetricsPath));
  }
  return http_answer(HttpStatus::kOk, kTextFormat, to_prometheus_text(collector.collect()));
}

}  // namespace

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& address,
                                                            const ListenerLimits& limits) {
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(address, /*allow_port_zero=*/true));
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collector_ = std::make_shared<detail::MetricsCollector>();
  RequestServerOptions options;
  options.name = "metrics";
  options.limits = limits;
  options.max_request_bytes = kMaxRequestHeadBytes + kHeadEnd.size();
  Result<std::unique_ptr<RequestServer>> listening = RequestServer::start(
      endpoint, std::move(options), frame_scrape,
      [collector = server->collector_](std::span<const std::byte> request, const RequestPeer&) {
        return answer_scrape(request, *collector);
      });
  if (!listening.ok()) {
    return Internal(fmt::format("metrics server: cannot listen on {}: {}", address,
                                listening.status().message()));
  }
  server->listener_ = std::move(*listening);
  server->address_ = endpoint.host + ":" + std::to_string(server->listener_->endpoint().port);
  return server;
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::add_source(Source source) { return collector_->add(std::move(source)); }
void MetricsServer::remove_source(int id) { collector_->remove(id); }

std::string to_prometheus_text(const MetricsSnapshot& snapshot) {
  return prometheus::TextSerializer().Serialize(detail::to_prometheus(snapshot));
}

}  // namespace kvferry
