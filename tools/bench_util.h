// Small measuring helpers for the bench commands.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvferry::cli {

// Runs `once` (which returns false to stop) repeatedly for at least `min_time_ms` (and at
// least 3 times, at most 100,000), after one unmeasured warm-up; keeps each duration.
class LatencySampler {
 public:
  template <typename F>
  void run(int min_time_ms, F&& once) {
    if (!once()) return;  // warm-up: page faults, mappings, caches
    auto start = std::chrono::steady_clock::now();
    auto until = start + std::chrono::milliseconds(min_time_ms);
    while (samples_.size() < 3 ||
           (std::chrono::steady_clock::now() < until && samples_.size() < 100000)) {
      auto t0 = std::chrono::steady_clock::now();
      if (!once()) return;
      samples_.push_back(
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(samples_.begin(), samples_.end());
  }
  double mean_ns() const {
    double sum = 0;
    for (double s : samples_) sum += s;
    return samples_.empty() ? 0 : sum / samples_.size();
  }
  double percentile_us(double p) const {
    if (samples_.empty()) return 0;
    size_t i = std::min(samples_.size() - 1, static_cast<size_t>(p / 100.0 * samples_.size()));
    return samples_[i] / 1e3;
  }
  size_t count() const { return samples_.size(); }
  void add(double ns) { samples_.push_back(ns); }
  void finish() { std::sort(samples_.begin(), samples_.end()); }

 private:
  std::vector<double> samples_;
};

// Runs every contestant once per round, in turn (starting one further each round), for at
// least `min_time_ms` (and at least 3 rounds), after one unmeasured warm-up round. On a shared
// machine a slow spell then hits every contestant alike, so their ratios stay meaningful. A
// contestant returning false stops the run. Returns one sampler per contestant.
inline std::vector<LatencySampler> run_interleaved(
    int min_time_ms, const std::vector<std::function<bool()>>& contestants) {
  std::vector<LatencySampler> out(contestants.size());
  for (const auto& c : contestants) {
    if (!c()) return out;
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(min_time_ms);
  for (size_t round = 0; round < 3 || (std::chrono::steady_clock::now() < until && round < 100000);
       ++round) {
    // The starting contestant rotates each round: whoever runs right after another one
    // inherits its cache state, and that must not always be the same contestant.
    for (size_t k = 0; k < contestants.size(); ++k) {
      const size_t i = (round + k) % contestants.size();
      auto t0 = std::chrono::steady_clock::now();
      if (!contestants[i]()) return out;
      out[i].add(
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  for (auto& s : out) s.finish();
  return out;
}

inline std::string format_bytes(uint64_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{}MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}KiB", b >> 10);
  return fmt::format("{}B", b);
}

inline void write_json(const std::string& path, const nlohmann::json& value) {
  if (path == "-") {
    std::cout << value.dump(2) << "\n";
    return;
  }
  std::ofstream(path) << value.dump(2) << "\n";
}

}  // namespace kvferry::cli
