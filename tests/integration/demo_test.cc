// The README's main job, end to end: `kvferry demo --json` in a real process.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/child_process.h"
#include "test_support.h"

namespace kvferry {
namespace {

TEST(Demo, EveryRequestSucceedsAndEveryPageVerifies) {
  ChildProcess demo = testing::must(ChildProcess::spawn(
      {KVFERRY_CLI_PATH, "demo", "--json", "--requests", "32", "--pool-pages", "256"}));
  std::string line = testing::must(demo.read_line(std::chrono::seconds(120)));
  auto summary = nlohmann::json::parse(line, nullptr, false);
  ASSERT_FALSE(summary.is_discarded()) << line;
  EXPECT_EQ(summary["requests"], 32);
  EXPECT_EQ(summary["succeeded"], 32);
  EXPECT_EQ(summary["failed"], 0);
  // Every page of every request, verified by the decode process itself.
  EXPECT_GE(summary["pages_verified"].get<uint64_t>(), 32u);
  EXPECT_EQ(summary["corrupt_pages"], 0);
  EXPECT_GT(summary["bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(testing::must(demo.finish(std::chrono::seconds(30))), 0);
}

}  // namespace
}  // namespace kvferry
