// `kvferry bench engine`, `bench kv`, `bench scale` and `demo` given a bad value: each run exits
// non-zero before it measures or starts anything, and its message names the option and the value.
// Unchecked, a negative --ops would print cells "skipped" for 17 EiB batches, --threads 0
// would measure a "thr=0" cell, --tokens 0 would move a page per layer, a port above 65535
// would reach iperf3, and a demo with --prefill-tp 0 would wait for the missing side until
// its timeout. `--help` of the first-hour commands shows every numeric default.
#include <gtest/gtest.h>

#include <sstream>
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
  std::string message;  // a part of the error that names the option and the value
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

class CliBadValue : public ::testing::TestWithParam<BadValue> {};

TEST_P(CliBadValue, ExitsBeforeStartingAnythingAndNamesTheOptionAndValue) {
  const BadValue& bad = GetParam();
  CliRun run = run_cli(bad.args);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(bad.message), std::string::npos) << run.output;
  for (const char* started : {"GB/s", "skipped", "listening on", "bootstrap 127"}) {
    EXPECT_EQ(run.output.find(started), std::string::npos) << "started anyway:\n" << run.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    BenchEngine, CliBadValue,
    ::testing::Values(
        BadValue{{"bench", "engine", "--threads", "0"}, "--threads: Value 0 "},
        BadValue{{"bench", "engine", "--threads", "1,-1"}, "--threads: Value -1 "},
        BadValue{{"bench", "engine", "--ops", "-1"}, "--ops: Value -1 "},
        BadValue{{"bench", "engine", "--ops", "0"}, "--ops: Value 0 "},
        BadValue{{"bench", "engine", "--block-bytes", "4096,0"}, "--block-bytes: Value 0 "},
        BadValue{{"bench", "engine", "--max-batch-bytes", "0"}, "--max-batch-bytes: Value 0 "},
        BadValue{{"bench", "engine", "--min-time-ms", "-5"}, "--min-time-ms: Value -5 "},
        BadValue{{"bench", "engine", "--rounds", "0"}, "--rounds: Value 0 "},
        BadValue{{"bench", "engine", "--iperf3-port", "70000"}, "--iperf3-port: Value 70000 "}));

INSTANTIATE_TEST_SUITE_P(
    BenchKv, CliBadValue,
    ::testing::Values(BadValue{{"bench", "kv", "--tokens", "128,0"}, "--tokens: Value 0 "},
                      BadValue{{"bench", "kv", "--min-time-ms", "0"}, "--min-time-ms: Value 0 "},
                      BadValue{{"bench", "kv", "--min-rounds", "0"}, "--min-rounds: Value 0 "},
                      BadValue{{"bench", "kv", "--max-memory-gib", "-1"},
                               "--max-memory-gib: Value -1 "}));

INSTANTIATE_TEST_SUITE_P(
    BenchScale, CliBadValue,
    ::testing::Values(BadValue{{"bench", "scale", "--axis", "peers,nope"},
                               "--axis nope (valid: all, peers, regions"},
                      BadValue{{"bench", "scale", "--peers", "1,0"}, "--peers: Value 0 "},
                      BadValue{{"bench", "scale", "--descriptors", "1000000000"},
                               "--descriptors: Value 1000000000 "},
                      BadValue{{"bench", "scale", "--min-time-ms", "0"},
                               "--min-time-ms: Value 0 "}));

INSTANTIATE_TEST_SUITE_P(
    Demo, CliBadValue,
    ::testing::Values(BadValue{{"demo", "--prefill-tp", "0"}, "--prefill-tp 0 (valid: 1..64)"},
                      BadValue{{"demo", "--decode-tp", "0"}, "--decode-tp 0 (valid: 1..64)"},
                      BadValue{{"demo", "--decode-instances", "65"},
                               "--decode-instances 65 (valid: 1..64)"},
                      BadValue{{"demo", "--requests", "-1"}, "--requests -1 (valid: 1.."},
                      BadValue{{"demo", "--timeout-s", "0"}, "--timeout-s 0 (valid: 1.."},
                      BadValue{{"demo", "--min-tokens", "600", "--max-tokens", "512"},
                               "--min-tokens 600 is more than --max-tokens 512"}));

// A newcomer reading --help learns what each option does when left out: every option with a
// numeric value shows its default ("--requests INT=64"), in the commands a first hour uses.
TEST(CliHelp, EveryNumericOptionShowsItsDefault) {
  for (const std::vector<std::string>& command :
       {std::vector<std::string>{"demo", "--help"},
        std::vector<std::string>{"bench", "engine", "--help"},
        std::vector<std::string>{"bench", "scale", "--help"},
        {"serve", "--help"}}) {
    CliRun run = run_cli(command);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    size_t numeric = 0;
    std::istringstream lines(run.output);
    for (std::string line; std::getline(lines, line);) {
      const size_t dashes = line.find("--");
      if (dashes == std::string::npos) continue;
      const bool is_numeric = line.find(" INT", dashes) != std::string::npos ||
                              line.find(" UINT", dashes) != std::string::npos;
      if (!is_numeric) continue;
      ++numeric;
      const std::string option = line.substr(dashes, line.find(' ', dashes) - dashes);
      EXPECT_NE(line.find('=', dashes), std::string::npos)
          << command.front() << " " << option << " shows no default: " << line;
    }
    EXPECT_GE(numeric, 3u) << run.output;
  }
}

}  // namespace
}  // namespace kvferry
