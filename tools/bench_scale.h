// `kvferry bench scale`: how the engine's and the PD layer's costs grow, one axis at a time
// (the others kept small), in one run. Shared by the command (bench_scale.cc) and its axes
// (bench_scale_engine.cc: peers, regions, descriptors, inflight; bench_scale_pd.cc: pd).
//
// Each axis yields points {axis, x, metrics...}: one JSON object per point, so a plot script
// draws one chart per axis against x (log scale), and one table per axis on stdout.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::cli {

enum class ScaleAxis : uint8_t { kPeers = 0, kRegions, kDescriptors, kInflight, kPd };

inline constexpr ScaleAxis kAllScaleAxes[] = {ScaleAxis::kPeers, ScaleAxis::kRegions,
                                              ScaleAxis::kDescriptors, ScaleAxis::kInflight,
                                              ScaleAxis::kPd};

std::string_view scale_axis_name(ScaleAxis axis);
// "all" yields every axis. Errors name the value and list the valid names.
Result<std::vector<ScaleAxis>> parse_scale_axes(const std::vector<std::string>& names);

struct ScaleArgs {
  std::vector<std::string> axes = {"all"};
  // 256 tcp peers means 256 `kvferry serve` children (about 14 threads and a few MiB each):
  // too heavy for a default run on 2 cores, so the default list stops at 64.
  std::vector<uint64_t> peers = {1, 4, 16, 64};
  std::vector<uint64_t> regions = {1, 100, 10'000, 100'000};
  std::vector<uint64_t> descriptors = {1'000, 10'000, 100'000, 1'000'000};
  std::vector<uint64_t> batches = {1, 10, 100, 1'000, 10'000};
  std::vector<uint64_t> requests_in_flight = {1, 16, 256, 4'096};
  // Measuring time per point (and per contestant where a point has several); every point
  // also takes at least kMinSamples samples after one unmeasured warm-up.
  int min_time_ms = 100;
  std::string pd_model = "tiny-mha";
  uint32_t pd_page_tokens = 16;
  std::string json_path;
};

// One measured point of one axis. `series` tells apart curves of one axis (e.g. merged and
// unmerged descriptors, local and tcp in flight); empty when the axis has one curve.
struct ScalePoint {
  ScaleAxis axis;
  std::string series;
  uint64_t x = 0;
  nlohmann::ordered_json metrics = nlohmann::ordered_json::object();
};

// Every measured point takes at least this many samples (beyond a warm-up), and at most
// kMaxSamples.
inline constexpr size_t kMinSamples = 3;
inline constexpr size_t kMaxSamples = 100'000;

// Calls once(false) as an unmeasured warm-up, then once(true) until `min_time_ms` has passed
// and at least max(kMinSamples, min_samples) calls ran (at most kMaxSamples). `once` times
// what it measures itself (a call may hold parts timed apart) and returns its status; the
// first error stops the loop and is returned.
template <typename F>
Status repeat_for(int min_time_ms, F&& once, size_t min_samples = kMinSamples) {
  KVF_RETURN_IF_ERROR(once(false));
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(min_time_ms);
  const size_t least = std::max(kMinSamples, min_samples);
  for (size_t i = 0; i < least || (i < kMaxSamples && std::chrono::steady_clock::now() < until);
       ++i) {
    KVF_RETURN_IF_ERROR(once(true));
  }
  return Status::Ok();
}

// Unmeasured turns until the turns stop getting faster: the best of the last kSteadyWindow
// turns is within kSteadyGain of the best of the window before (at most kMaxWarmTurns).
// Data out of the caches warms over many turns, not one: on the 2-core Xeon VM of
// docs/PERFORMANCE.md a plain loop of a million 64-byte copies between freshly written
// buffers (64 MB in, 128 MB out) took 16-21 ns a copy in its first turn and settled near
// 9-10 ns after 10-18 turns, so a point measured after one warm-up turn measured that
// transient, and whichever contestant went first measured more of it. `once` returns the
// time of one turn in nanoseconds (or why it failed).
inline constexpr size_t kSteadyWindow = 3;
inline constexpr double kSteadyGain = 0.05;
inline constexpr size_t kMaxWarmTurns = 60;
template <typename F>
Status warm_until_steady(F&& once) {
  std::vector<double> turns;
  while (turns.size() < kMaxWarmTurns) {
    KVF_ASSIGN_OR_RETURN(double ns, once());
    turns.push_back(ns);
    if (turns.size() < 2 * kSteadyWindow) continue;
    const auto last = turns.end() - kSteadyWindow;
    const double recent = *std::min_element(last, turns.end());
    const double before = *std::min_element(last - kSteadyWindow, last);
    if (recent >= before * (1 - kSteadyGain)) break;
  }
  return Status::Ok();
}

// An engine with default options and this name (the axes' engines differ only by name).
inline Result<std::unique_ptr<TransferEngine>> make_scale_engine(const std::string& name) {
  EngineOptions options;
  options.name = name;
  return TransferEngine::create(options);
}

// Nanoseconds from `start` to now.
inline double ns_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
}

Status run_peers_axis(const ScaleArgs& args, std::vector<ScalePoint>& out);
Status run_regions_axis(const ScaleArgs& args, std::vector<ScalePoint>& out);
Status run_descriptors_axis(const ScaleArgs& args, std::vector<ScalePoint>& out);
Status run_inflight_axis(const ScaleArgs& args, std::vector<ScalePoint>& out);
Status run_pd_axis(const ScaleArgs& args, std::vector<ScalePoint>& out);

// Prints `point` as a table row (after a header when its axis or columns differ from the
// previous point's) and appends it to `out`.
void add_scale_point(std::vector<ScalePoint>& out, ScalePoint point);

}  // namespace kvferry::cli
