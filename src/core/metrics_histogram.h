// LatencyHistogram: a fixed-bucket latency histogram updated with relaxed atomics, for the
// metrics of include/kvferry/metrics.h. Buckets double from 1 us to about 17 s, so the
// bucket of an observation is a bit-width, not a search.
//
// Thread-safety: observe() and to_point() may run concurrently from any threads; a point
// read during observations may count one of them in `count` but not yet in its bucket.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kvferry/metrics.h"

namespace kvferry {

class LatencyHistogram {
 public:
  // Upper bounds 2^10 ns (~1 us) .. 2^34 ns (~17 s), then +Inf.
  static constexpr int kFirstBoundLog2Ns = 10;
  static constexpr int kBounds = 25;

  void observe(std::chrono::nanoseconds elapsed) {
    const uint64_t ns = elapsed.count() > 0 ? static_cast<uint64_t>(elapsed.count()) : 0;
    // ns <= 2^(10+i) goes to bucket i: the bit width of (ns - 1) >> 10.
    const int width = ns == 0 ? 0 : std::bit_width((ns - 1) >> kFirstBoundLog2Ns);
    const int bucket = width < kBounds ? width : kBounds;
    buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  }

  // Bounds in seconds, as a MetricFamily wants them.
  static std::vector<double> bounds_seconds();
  MetricPoint to_point(MetricLabels labels) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace kvferry
