#include "kvferry/metrics.h"

#include <algorithm>

#include "core/metrics_histogram.h"

namespace kvferry {
namespace {

bool has_labels(const MetricPoint& point, const MetricLabels& wanted) {
  return std::all_of(wanted.begin(), wanted.end(), [&](const auto& label) {
    return std::find(point.labels.begin(), point.labels.end(), label) != point.labels.end();
  });
}

}  // namespace

const MetricFamily* MetricsSnapshot::find(std::string_view name) const {
  for (const MetricFamily& f : families) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

const MetricPoint* MetricsSnapshot::find(std::string_view name, const MetricLabels& labels) const {
  const MetricFamily* family = find(name);
  if (family == nullptr) return nullptr;
  for (const MetricPoint& p : family->points) {
    if (has_labels(p, labels)) return &p;
  }
  return nullptr;
}

double MetricsSnapshot::value(std::string_view name, const MetricLabels& labels) const {
  const MetricFamily* family = find(name);
  if (family == nullptr) return 0;
  double total = 0;
  for (const MetricPoint& p : family->points) {
    if (!has_labels(p, labels)) continue;
    total += family->type == MetricType::kHistogram ? static_cast<double>(p.count) : p.value;
  }
  return total;
}

void MetricsSnapshot::merge(MetricsSnapshot other) {
  for (MetricFamily& f : other.families) {
    auto it = std::find_if(families.begin(), families.end(),
                           [&](const MetricFamily& mine) { return mine.name == f.name; });
    if (it == families.end()) {
      families.push_back(std::move(f));
    } else {
      std::move(f.points.begin(), f.points.end(), std::back_inserter(it->points));
    }
  }
}

std::vector<double> LatencyHistogram::bounds_seconds() {
  std::vector<double> bounds;
  bounds.reserve(kBounds);
  for (int i = 0; i < kBounds; ++i) {
    bounds.push_back(static_cast<double>(uint64_t{1} << (kFirstBoundLog2Ns + i)) * 1e-9);
  }
  return bounds;
}

MetricPoint LatencyHistogram::to_point(MetricLabels labels) const {
  MetricPoint point;
  point.labels = std::move(labels);
  uint64_t running = 0;
  point.cumulative_counts.reserve(kBounds);
  for (int i = 0; i < kBounds; ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    point.cumulative_counts.push_back(running);
  }
  point.count = running + buckets_[kBounds].load(std::memory_order_relaxed);
  point.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return point;
}

}  // namespace kvferry
