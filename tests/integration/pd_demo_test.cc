// The PD session layer across real processes, through `kvferry demo`: a bootstrap server,
// prefill rank processes and decode rank processes; every page verified by decode.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/child_process.h"
#include "test_support.h"

namespace kvferry {
namespace {

nlohmann::json run_demo(std::vector<std::string> extra, std::chrono::seconds timeout) {
  std::vector<std::string> argv = {KVFERRY_CLI_PATH, "demo", "--json", "--heartbeat-ms", "200"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ChildProcess demo = testing::must(ChildProcess::spawn(argv));
  std::string line = testing::must(demo.read_line(timeout));
  auto summary = nlohmann::json::parse(line, nullptr, false);
  EXPECT_FALSE(summary.is_discarded()) << line;
  EXPECT_EQ(testing::must(demo.finish(std::chrono::seconds(30))), 0) << line;
  return summary;
}

void expect_all_verified(const nlohmann::json& s, int requests) {
  EXPECT_EQ(s["requests"], requests) << s.dump();
  EXPECT_EQ(s["succeeded"], requests) << s.dump();
  EXPECT_EQ(s["failed"], 0) << s.dump();
  EXPECT_EQ(s["corrupt_pages"], 0) << s.dump();
  EXPECT_GE(s["pages_verified"].get<uint64_t>(), static_cast<uint64_t>(requests));
}

struct TpCase {
  const char* model;
  const char* prefill_tp;
  const char* decode_tp;
};

class PdProcesses : public ::testing::TestWithParam<TpCase> {};

// Several chunks per request (chunk 32 tokens, prompts up to 200), aux row with the last.
TEST_P(PdProcesses, EveryRankVerifiesEveryPage) {
  const TpCase c = GetParam();
  auto s = run_demo({"--model", c.model, "--prefill-tp", c.prefill_tp, "--decode-tp", c.decode_tp,
                     "--requests", "24", "--pool-pages", "128", "--min-tokens", "40",
                     "--max-tokens", "200", "--chunk-tokens", "32"},
                    std::chrono::seconds(120));
  expect_all_verified(s, 24);
}

INSTANTIATE_TEST_SUITE_P(
    TpPairs, PdProcesses,
    ::testing::Values(TpCase{"tiny-mha", "1", "1"}, TpCase{"tiny-mha", "1", "2"},
                      TpCase{"tiny-mha", "2", "1"}, TpCase{"tiny-mla", "1", "2"},
                      TpCase{"tiny-mla", "2", "1"}, TpCase{"llama-3.1-8b", "2", "1"}));

TEST(PdProcesses, ThousandRequestsInFlightAcrossTwoDecodeProcesses) {
  auto s = run_demo(
      {"--model", "tiny-mha", "--requests", "1000", "--decode-instances", "2", "--pool-pages",
       "4096", "--min-tokens", "8", "--max-tokens", "64", "--chunk-tokens", "32"},
      std::chrono::seconds(240));
  expect_all_verified(s, 1000);
}

// Opt-in integrity across processes: every request verified against prefill's digests, and
// with one byte flipped per request after it landed, every request fails as DataCorrupted
// naming the page.
TEST(PdProcesses, IntegrityVerifiesEveryPageAndCatchesAFlippedByte) {
  const std::vector<std::string> base = {
      "--model",      "tiny-mha", "--prefill-tp",   "2",  "--requests", "16", "--min-tokens", "40",
      "--max-tokens", "200",      "--chunk-tokens", "32", "--integrity"};
  expect_all_verified(run_demo(base, std::chrono::seconds(120)), 16);

  std::vector<std::string> corrupt = base;
  corrupt.emplace_back("--corrupt-for-test");
  std::vector<std::string> argv = {KVFERRY_CLI_PATH, "demo", "--json", "--heartbeat-ms", "200"};
  argv.insert(argv.end(), corrupt.begin(), corrupt.end());
  ChildProcess demo = testing::must(ChildProcess::spawn(argv));
  std::string line = testing::must(demo.read_line(std::chrono::seconds(120)));
  auto s = nlohmann::json::parse(line, nullptr, false);
  ASSERT_FALSE(s.is_discarded()) << line;
  testing::must(demo.finish(std::chrono::seconds(30)));
  EXPECT_EQ(s["requests"], 16) << line;
  EXPECT_EQ(s["succeeded"], 0) << line;
  EXPECT_EQ(s["failed"], 16) << line;
  const std::string error = s["first_error"].get<std::string>();
  EXPECT_NE(error.find("DataCorrupted"), std::string::npos) << error;
  EXPECT_NE(error.find(": page "), std::string::npos) << error;
}

// --transport auto lets the engines route each op: KV pools of plain registered host memory
// (--memory host, as serving stacks register theirs) go over cma, allocate_shared pools over
// shm; never tcp on one host.
TEST(PdProcesses, AutoTransportOnRegisteredHostMemoryTakesTheCrossMemoryRoute) {
  auto s = run_demo(
      {"--model", "tiny-mha", "--transport", "auto", "--memory", "host", "--requests", "24",
       "--pool-pages", "128", "--min-tokens", "40", "--max-tokens", "200", "--chunk-tokens", "32"},
      std::chrono::seconds(120));
  expect_all_verified(s, 24);
  const nlohmann::json& routes = s["transport_bytes"];
  EXPECT_GE(routes.value("cma", uint64_t{0}), s["bytes"].get<uint64_t>()) << s.dump();
  EXPECT_FALSE(routes.contains("tcp")) << s.dump();
  EXPECT_FALSE(routes.contains("shm")) << s.dump();
}

TEST(PdProcesses, AutoTransportOnSharedMemoryTakesShm) {
  auto s = run_demo({"--model", "tiny-mla", "--transport", "auto", "--requests", "8",
                     "--pool-pages", "128", "--min-tokens", "40", "--max-tokens", "200"},
                    std::chrono::seconds(120));
  expect_all_verified(s, 8);
  const nlohmann::json& routes = s["transport_bytes"];
  EXPECT_GE(routes.value("shm", uint64_t{0}), s["bytes"].get<uint64_t>()) << s.dump();
  EXPECT_FALSE(routes.contains("cma")) << s.dump();
  EXPECT_FALSE(routes.contains("tcp")) << s.dump();
}

TEST(PdProcesses, UnknownTransportIsRefusedByName) {
  ChildProcess demo = testing::must(
      ChildProcess::spawn({KVFERRY_CLI_PATH, "demo", "--transport", "carrier-pigeon"}));
  EXPECT_EQ(testing::must(demo.finish(std::chrono::seconds(30))), 1);
}

}  // namespace
}  // namespace kvferry
