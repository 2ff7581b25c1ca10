// `kvferry bench scale` in a real process, every axis at two small points: each axis yields a
// point per x with its figures, the bytes each axis moved are verified by the bench itself
// (it exits non-zero on a byte that did not land), and the figures that are counts hold what
// the run did (a tcp peer adds threads and descriptors; every PD request's page is verified).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/child_process.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using testing::must;

TEST(BenchScale, EveryAxisYieldsAPointPerXAndVerifiesWhatItMoved) {
  const std::filesystem::path out = std::filesystem::temp_directory_path() /
                                    ("kvferry-bench-scale-" + std::to_string(::getpid()) + ".json");
  ChildProcess bench = must(ChildProcess::spawn(
      {KVFERRY_CLI_PATH, "bench", "scale", "--peers", "1,2", "--regions", "1,300", "--descriptors",
       "1000,3000", "--batches", "1,8", "--requests-in-flight", "1,4", "--min-time-ms", "1",
       "--json", out.string()}));
  std::string table;
  for (;;) {
    Result<std::string> line = bench.read_line(120s);
    if (!line.ok()) break;
    table += *line + "\n";
  }
  ASSERT_EQ(must(bench.finish(30s)), 0) << table;
  std::ifstream file(out);
  const json points = json::parse(file, nullptr, false);
  std::filesystem::remove(out);
  ASSERT_TRUE(points.is_array()) << table;

  // axis -> series -> the x values, in the order measured.
  std::map<std::string, std::map<std::string, std::vector<uint64_t>>> seen;
  for (const json& p : points) seen[p["axis"]][p["series"]].push_back(p["x"]);
  using Xs = std::vector<uint64_t>;
  EXPECT_EQ(seen["peers"]["tcp"], (Xs{1, 2})) << table;
  EXPECT_EQ(seen["regions"][""], (Xs{1, 300})) << table;
  EXPECT_EQ(seen["descriptors"]["merged"], (Xs{1000, 3000})) << table;
  EXPECT_EQ(seen["descriptors"]["unmerged"], (Xs{1000, 3000})) << table;
  EXPECT_EQ(seen["descriptors"]["shuffled"], (Xs{1000, 3000})) << table;
  EXPECT_EQ(seen["inflight"]["local"], (Xs{1, 8})) << table;
  EXPECT_EQ(seen["inflight"]["tcp"], (Xs{1, 8})) << table;
  ASSERT_EQ(seen["pd"].size(), 1u) << table;
  EXPECT_EQ(seen["pd"].begin()->second, (Xs{1, 4})) << table;

  for (const json& p : points) {
    SCOPED_TRACE(p.dump());
    if (p["axis"] == "peers") {
      // A tcp peer holds at least its control connection open once written to.
      EXPECT_GE(p["fds_per_peer"].get<double>(), 1.0);
      EXPECT_GE(p["threads"].get<uint64_t>(), p["threads_idle"].get<uint64_t>());
      EXPECT_GT(p["p50_us"].get<double>(), 0.0);
      EXPECT_GT(p["plain_p50_us"].get<double>(), 0.0);  // the same-run plain TCP reference
    } else if (p["axis"] == "regions") {
      EXPECT_EQ(p["peer_parses"], 1);
      EXPECT_GT(p["descriptor_bytes"].get<uint64_t>(), 0u);
      EXPECT_GT(p["register_ms"].get<double>(), 0.0);
    } else if (p["axis"] == "pd") {
      // Every wave's pages, verified: at least the warm-up-free minimum of 3 waves each.
      EXPECT_GE(p["pages_verified"].get<uint64_t>(), 3 * p["x"].get<uint64_t>());
      EXPECT_GT(p["requests_per_s"].get<double>(), 0.0);
    } else {
      EXPECT_GE(p["samples"].get<uint64_t>(), 3u);
    }
  }
}

}  // namespace
}  // namespace kvferry
