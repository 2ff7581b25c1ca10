// ChildProcess::read_to_end: every line a child writes, the last one without its newline too,
// and a bounded wait for a child that never closes its output.
#include "core/child_process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

namespace kvferry {
namespace {

TEST(ChildProcessReadToEnd, GivesEveryLineIncludingAnUnterminatedLastOne) {
  auto child = ChildProcess::spawn({"/bin/sh", "-c", "printf 'first\\n\\nthird'"});
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  auto lines = child->read_to_end(std::chrono::seconds(10));
  ASSERT_TRUE(lines.ok()) << lines.status().to_string();
  EXPECT_EQ(*lines, (std::vector<std::string>{"first", "", "third"}));
  auto exit_code = child->finish(std::chrono::seconds(5));
  ASSERT_TRUE(exit_code.ok());
  EXPECT_EQ(*exit_code, 0);
}

TEST(ChildProcessReadToEnd, AChildThatKeepsItsOutputOpenTimesOut) {
  auto child = ChildProcess::spawn({"/bin/sh", "-c", "echo started; exec sleep 30"});
  ASSERT_TRUE(child.ok()) << child.status().to_string();
  const auto began = std::chrono::steady_clock::now();
  auto lines = child->read_to_end(std::chrono::milliseconds(200));
  ASSERT_FALSE(lines.ok());
  EXPECT_EQ(lines.status().code(), StatusCode::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(10));
  child->kill_now();
}

}  // namespace
}  // namespace kvferry
