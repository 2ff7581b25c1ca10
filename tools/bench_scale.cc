// `kvferry bench scale`: curves, not points. Each axis is swept on its own, the others kept
// small, in one run (bench_scale.h lists the axes; each axis' file says how it measures):
//
//   peers        one engine here, N tcp peers (each a `kvferry serve` child): threads, RSS
//                and fds per peer, open_peer time, first and steady-state 64 KiB writes
//                (against a plain TCP stream to the same children)
//   regions      N 4 KiB regions registered and unregistered in one batch, the descriptor a
//                peer fetches (bytes, handshake time), submit cost of a 64-byte local write
//   descriptors  one batch of N 64-byte local ops, merged, unmerged and shuffled: cost per op,
//                and what the engine adds to the same copies as a plain loop
//   inflight     N one-op 4 KiB batches submitted before any is waited for: cost per batch
//   pd           N one-page PD requests in flight through the PD layer: requests/s, and at
//                N = 1 the overhead over an engine transfer of the same page
//
// Prints one table per axis and, with --json, one object per point {axis, series, x, ...}.
#include "bench_scale.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>

#include "commands.h"

namespace kvferry::cli {

namespace {

struct AxisName {
  ScaleAxis axis;
  std::string_view name;
};
constexpr AxisName kAxisNames[] = {{ScaleAxis::kPeers, "peers"},
                                   {ScaleAxis::kRegions, "regions"},
                                   {ScaleAxis::kDescriptors, "descriptors"},
                                   {ScaleAxis::kInflight, "inflight"},
                                   {ScaleAxis::kPd, "pd"}};
constexpr std::string_view kAllAxes = "all";

// The largest x each axis takes: bounds on what a typo (--descriptors 1e12) would allocate or
// start. Each point's memory is about x times 4 KiB (regions, batches), 200 bytes
// (descriptors) or one page of the PD model (requests); a peer is a child process.
constexpr uint64_t kMaxPeers = 4'096;
constexpr uint64_t kMaxRegions = 10'000'000;
constexpr uint64_t kMaxDescriptors = 10'000'000;
constexpr uint64_t kMaxBatches = 1'000'000;
constexpr uint64_t kMaxRequestsInFlight = 65'536;

std::string valid_axis_names() {
  std::string names(kAllAxes);
  for (const AxisName& a : kAxisNames) names += ", " + std::string(a.name);
  return names;
}

// A metric value as a table cell: integers as they are, other numbers with 3 significant
// digits at least (no exponent below a million).
std::string format_cell(const nlohmann::ordered_json& value) {
  if (value.is_number_integer() || value.is_number_unsigned()) return value.dump();
  if (value.is_number_float()) {
    const double v = value.get<double>();
    if (v == 0) return "0";
    const double a = std::abs(v);
    if (a >= 1e6) return fmt::format("{:.3g}", v);
    if (a >= 100) return fmt::format("{:.0f}", v);
    if (a >= 1) return fmt::format("{:.2f}", v);
    return fmt::format("{:.3f}", v);
  }
  if (value.is_string()) return value.get<std::string>();
  return value.dump();
}

constexpr size_t kMinCellWidth = 9;

void print_row(const std::vector<std::string>& cells, const std::vector<size_t>& widths) {
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    line += fmt::format("{:>{}}  ", cells[i], widths[i]);
  }
  while (!line.empty() && line.back() == ' ') line.pop_back();
  std::cout << line << "\n" << std::flush;
}

Status run_axis(ScaleAxis axis, const ScaleArgs& args, std::vector<ScalePoint>& out) {
  switch (axis) {
    case ScaleAxis::kPeers: return run_peers_axis(args, out);
    case ScaleAxis::kRegions: return run_regions_axis(args, out);
    case ScaleAxis::kDescriptors: return run_descriptors_axis(args, out);
    case ScaleAxis::kInflight: return run_inflight_axis(args, out);
    case ScaleAxis::kPd: return run_pd_axis(args, out);
  }
  return Internal("bench scale: unknown axis");
}

}  // namespace

std::string_view scale_axis_name(ScaleAxis axis) {
  for (const AxisName& a : kAxisNames) {
    if (a.axis == axis) return a.name;
  }
  return "?";
}

Result<std::vector<ScaleAxis>> parse_scale_axes(const std::vector<std::string>& names) {
  std::vector<ScaleAxis> out;
  auto add = [&out](ScaleAxis axis) {
    if (std::find(out.begin(), out.end(), axis) == out.end()) out.push_back(axis);
  };
  for (const std::string& name : names) {
    if (name == kAllAxes) {
      for (ScaleAxis axis : kAllScaleAxes) add(axis);
      continue;
    }
    auto it = std::find_if(std::begin(kAxisNames), std::end(kAxisNames),
                           [&name](const AxisName& a) { return a.name == name; });
    if (it == std::end(kAxisNames)) {
      return InvalidArgument("bench scale: --axis " + name + " (valid: " + valid_axis_names() +
                             ")");
    }
    add(it->axis);
  }
  if (out.empty())
    return InvalidArgument("bench scale: no --axis (valid: " + valid_axis_names() + ")");
  return out;
}

namespace {

void print_scale_point(const ScalePoint& point, bool header) {
  std::vector<std::string> names = {"series", std::string(scale_axis_name(point.axis))};
  std::vector<std::string> cells = {point.series.empty() ? "-" : point.series,
                                    std::to_string(point.x)};
  for (const auto& [key, value] : point.metrics.items()) {
    names.push_back(key);
    cells.push_back(format_cell(value));
  }
  std::vector<size_t> widths;
  for (size_t i = 0; i < names.size(); ++i) {
    widths.push_back(std::max({names[i].size(), cells[i].size(), kMinCellWidth}));
  }
  if (header) {
    std::cout << "\n# axis " << scale_axis_name(point.axis) << "\n";
    print_row(names, widths);
  }
  print_row(cells, widths);
}

std::vector<std::string> metric_names(const ScalePoint& p) {
  std::vector<std::string> names;
  for (const auto& [key, value] : p.metrics.items()) names.push_back(key);
  return names;
}

}  // namespace

void add_scale_point(std::vector<ScalePoint>& out, ScalePoint point) {
  const bool header = out.empty() || out.back().axis != point.axis ||
                      metric_names(out.back()) != metric_names(point);
  print_scale_point(point, header);
  out.push_back(std::move(point));
}

void add_bench_scale_command(CLI::App& bench) {
  auto args = std::make_shared<ScaleArgs>();
  CLI::App* cmd =
      bench.add_subcommand("scale", "how costs grow with peers, regions, descriptors, in flight");
  auto x_values = [&](const char* flag, std::vector<uint64_t>& into, uint64_t most,
                      const char* what) {
    cmd->add_option(flag, into, what)
        ->delimiter(',')
        ->check(CLI::Range(uint64_t{1}, most))
        ->capture_default_str();
  };
  cmd->add_option("--axis", args->axes, valid_axis_names())->delimiter(',')->capture_default_str();
  x_values("--peers", args->peers, kMaxPeers,
           "axis peers: tcp peers of one engine, each a `kvferry serve` child");
  x_values("--regions", args->regions, kMaxRegions,
           "axis regions: 4 KiB regions registered in one batch");
  x_values("--descriptors", args->descriptors, kMaxDescriptors,
           "axis descriptors: 64-byte ops in one batch");
  x_values("--batches", args->batches, kMaxBatches,
           "axis inflight: one-op 4 KiB batches submitted before any is waited for");
  x_values("--requests-in-flight", args->requests_in_flight, kMaxRequestsInFlight,
           "axis pd: one-page PD requests in flight");
  cmd->add_option("--min-time-ms", args->min_time_ms,
                  "measuring time per point and contestant (at least 3 samples each)")
      ->check(CLI::Range(1, 3'600'000))
      ->capture_default_str();
  cmd->add_option("--pd-model", args->pd_model, "axis pd: model preset of the KV pages")
      ->capture_default_str();
  cmd->add_option("--pd-page-tokens", args->pd_page_tokens, "axis pd: tokens per page")
      ->check(CLI::Range(1u, 1u << 16))
      ->capture_default_str();
  cmd->add_option("--json", args->json_path,
                  "write one object per point {axis, series, x, ...} to this file ('-' = stdout)");
  cmd->callback([args] {
    Result<std::vector<ScaleAxis>> axes = parse_scale_axes(args->axes);
    if (!axes.ok()) {
      std::cerr << "kvferry bench scale: " << axes.status().to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    std::vector<ScalePoint> points;
    for (ScaleAxis axis : *axes) {
      Status s = run_axis(axis, *args, points);
      if (!s.ok()) {
        std::cerr << "kvferry bench scale: axis " << scale_axis_name(axis) << ": " << s.to_string()
                  << "\n";
        throw CLI::RuntimeError(1);
      }
    }
    if (!args->json_path.empty()) {
      nlohmann::ordered_json out = nlohmann::ordered_json::array();
      for (const ScalePoint& p : points) {
        nlohmann::ordered_json row = {
            {"axis", std::string(scale_axis_name(p.axis))}, {"series", p.series}, {"x", p.x}};
        for (const auto& [key, value] : p.metrics.items()) row[key] = value;
        out.push_back(std::move(row));
      }
      // Ordered keys (write_json's nlohmann::json would sort them): axis, series, x first.
      if (args->json_path == "-") {
        std::cout << out.dump(2) << "\n";
      } else {
        std::ofstream file(args->json_path);
        file << out.dump(2) << "\n";
        if (!file.flush()) {
          std::cerr << "kvferry bench scale: cannot write --json " << args->json_path << ": "
                    << std::strerror(errno) << "\n";
          throw CLI::RuntimeError(1);
        }
      }
    }
  });
}

}  // namespace kvferry::cli
