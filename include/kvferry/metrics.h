// Metrics: what an engine or a PD endpoint counted, read in-process as a MetricsSnapshot
// (TransferEngine::metrics(), PrefillServer/DecodeClient::metrics()) or scraped over HTTP
// in Prometheus text format (MetricsServer, kvferry/metrics_server.h).
//
// Off by default (EngineOptions::metrics, PdOptions::metrics): an engine without them counts
// nothing and its snapshot is empty. On, the data path adds relaxed atomic increments only
// (no lock, no allocation); a snapshot reads them without stopping anyone, so counters of
// one snapshot may be a few operations apart from each other.
//
// Naming follows Prometheus: kvferry_<what>_<unit>[_total]; latencies are in seconds.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvferry {

enum class MetricType : uint8_t { kCounter, kGauge, kHistogram };

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// One labelled series. Counters and gauges use `value`; histograms the rest.
struct MetricPoint {
  MetricLabels labels;
  double value = 0;
  std::vector<uint64_t> cumulative_counts;  // histogram: observations <= bucket_bounds[i]
  uint64_t count = 0;                       // histogram: all observations (the +Inf bucket)
  double sum = 0;                           // histogram: sum of observations
};

struct MetricFamily {
  std::string name;
  std::string help;
  MetricType type = MetricType::kCounter;
  std::vector<double> bucket_bounds;  // histogram upper bounds, ascending (no +Inf)
  std::vector<MetricPoint> points;
};

struct MetricsSnapshot {
  std::vector<MetricFamily> families;

  const MetricFamily* find(std::string_view name) const;
  // The point of `name` whose labels include every (key, value) of `labels`; null if none.
  const MetricPoint* find(std::string_view name, const MetricLabels& labels) const;
  // The value of that point (a histogram's count), 0 when there is none.
  double value(std::string_view name, const MetricLabels& labels = {}) const;
  // Appends `other`'s families; a family already present gets `other`'s points added
  // (several engines exposed under one server, told apart by their labels).
  void merge(MetricsSnapshot other);
};

}  // namespace kvferry
