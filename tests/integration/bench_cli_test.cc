// `kvferry bench engine` and `bench kv` given a bad value: each run exits non-zero before it
// measures anything, and its message names the option and the value. Until these checks a
// negative --ops was printed as cells "skipped" for 17 EiB batches, --threads 0 measured a
// "thr=0" cell, --tokens 0 moved a page per layer, and a port above 65535 reached iperf3.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/child_process.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::must;

struct BadValue {
  std::vector<std::string> args;
  std::string option, value;
};

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::vector<std::string>& args) {
  std::string command = std::string("exec '") + KVFERRY_CLI_PATH + "'";
  for (const std::string& a : args) command += " '" + a + "'";
  ChildProcess child = must(ChildProcess::spawn({"/bin/sh", "-c", command + " 2>&1"}));
  CliRun run;
  for (;;) {
    Result<std::string> line = child.read_line(30s);
    if (!line.ok()) break;  // end of output (or a hang, caught by finish below)
    run.output += *line + "\n";
  }
  run.exit_code = must(child.finish(10s));
  return run;
}

class BenchCliBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(BenchCliBadValue, ExitsBeforeMeasuringAndNamesTheOptionAndValue) {
  const BadValue& bad = GetParam();
  CliRun run = run_cli(bad.args);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(bad.option), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("Value " + bad.value + " "), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("GB/s"), std::string::npos) << "measured anyway:\n" << run.output;
  EXPECT_EQ(run.output.find("skipped"), std::string::npos) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Engine, BenchCliBadValue,
    ::testing::Values(BadValue{{"bench", "engine", "--threads", "0"}, "--threads", "0"},
                      BadValue{{"bench", "engine", "--threads", "1,-1"}, "--threads", "-1"},
                      BadValue{{"bench", "engine", "--ops", "-1"}, "--ops", "-1"},
                      BadValue{{"bench", "engine", "--ops", "0"}, "--ops", "0"},
                      BadValue{{"bench", "engine", "--block-bytes", "4096,0"}, "--block-bytes", "0"},
                      BadValue{{"bench", "engine", "--max-batch-bytes", "0"}, "--max-batch-bytes",
                               "0"},
                      BadValue{{"bench", "engine", "--min-time-ms", "-5"}, "--min-time-ms", "-5"},
                      BadValue{{"bench", "engine", "--rounds", "0"}, "--rounds", "0"},
                      BadValue{{"bench", "engine", "--iperf3-port", "70000"}, "--iperf3-port",
                               "70000"}));

INSTANTIATE_TEST_SUITE_P(
    Kv, BenchCliBadValue,
    ::testing::Values(BadValue{{"bench", "kv", "--tokens", "128,0"}, "--tokens", "0"},
                      BadValue{{"bench", "kv", "--min-time-ms", "0"}, "--min-time-ms", "0"},
                      BadValue{{"bench", "kv", "--min-rounds", "0"}, "--min-rounds", "0"},
                      BadValue{{"bench", "kv", "--max-memory-gib", "-1"}, "--max-memory-gib",
                               "-1"}));

}  // namespace
}  // namespace kvferry
