// MetricsSnapshot -> Python dicts (Engine.metrics(), PrefillServer/DecodeClient.metrics()).
#include <pybind11/stl.h>

#include "binding_support.h"

namespace kvferry::python {

namespace {

const char* type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

}  // namespace

py::dict metrics_to_python(const MetricsSnapshot& snapshot) {
  py::dict out;
  for (const MetricFamily& f : snapshot.families) {
    py::list samples;
    for (const MetricPoint& p : f.points) {
      py::dict labels;
      for (const auto& [key, value] : p.labels) labels[py::str(key)] = value;
      if (f.type != MetricType::kHistogram) {
        samples.append(py::make_tuple(labels, p.value));
        continue;
      }
      py::list buckets;
      for (size_t i = 0; i < f.bucket_bounds.size() && i < p.cumulative_counts.size(); ++i) {
        buckets.append(py::make_tuple(f.bucket_bounds[i], p.cumulative_counts[i]));
      }
      py::dict histogram;
      histogram["count"] = p.count;
      histogram["sum"] = p.sum;
      histogram["buckets"] = buckets;
      samples.append(py::make_tuple(labels, histogram));
    }
    py::dict family;
    family["type"] = type_name(f.type);
    family["help"] = f.help;
    family["samples"] = samples;
    out[py::str(f.name)] = family;
  }
  return out;
}

}  // namespace kvferry::python
