#include "kvferry/metrics_server.h"

#include <fmt/format.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/text_serializer.h>

#include <exception>
#include <limits>
#include <map>
#include <mutex>

#include "core/net.h"

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

// The sources of one server, read at every scrape (on the server's threads).
class MetricsCollector final : public prometheus::Collectable {
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
  std::vector<prometheus::MetricFamily> Collect() const override {
    MetricsSnapshot all;
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, source] : sources_) all.merge(source());
    }
    return to_prometheus(all);
  }

 private:
  mutable std::mutex mu_;
  std::map<int, MetricsServer::Source> sources_;  // guarded by mu_
  int next_id_ = 1;                               // guarded by mu_
};

}  // namespace detail

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const std::string& address) {
  KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(address, /*allow_port_zero=*/true));
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collector_ = std::make_shared<detail::MetricsCollector>();
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(endpoint.to_string(), 1);
  } catch (const std::exception& e) {
    return Internal(fmt::format("metrics server: cannot listen on {}: {}", address, e.what()));
  }
  server->exposer_->RegisterCollectable(server->collector_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return Internal(fmt::format("metrics server: no listening port for {}", address));
  }
  server->address_ = endpoint.host + ":" + std::to_string(ports.front());
  return server;
}

MetricsServer::~MetricsServer() = default;

int MetricsServer::add_source(Source source) { return collector_->add(std::move(source)); }
void MetricsServer::remove_source(int id) { collector_->remove(id); }

std::string to_prometheus_text(const MetricsSnapshot& snapshot) {
  return prometheus::TextSerializer().Serialize(detail::to_prometheus(snapshot));
}

}  // namespace kvferry
