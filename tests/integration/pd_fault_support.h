// Real-process PD setups for the fault tests: `kvferry bootstrap`, `kvferry pd-prefill` and
// `kvferry pd-decode` children whose stderr goes to a log file the test can read (to check
// that a rejection was logged), and the line commands the tests speak to them.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/child_process.h"
#include "test_support.h"

namespace kvferry::testing {

using namespace std::chrono_literals;

inline constexpr auto kHello = 30s;

// A worker process, its hello line and its stderr log.
struct PdProcess {
  ChildProcess process;
  nlohmann::json hello;
  std::string log_path;

  std::string log() const {
    std::ifstream in(log_path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // Reads lines until one starts with `prefix` (others are progress or replies the test does
  // not wait for) and returns it; fails the test after `timeout`.
  std::string wait_line(const std::string& prefix, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) break;
      Result<std::string> line = process.read_line(left);
      if (!line.ok()) {
        ADD_FAILURE() << "waiting for '" << prefix << "': " << line.status().to_string()
                      << "\nlog:\n"
                      << log();
        return "";
      }
      if (line->rfind(prefix, 0) == 0) return *line;
    }
    ADD_FAILURE() << "no line starting with '" << prefix << "' within " << timeout.count()
                  << " ms\nlog:\n"
                  << log();
    return "";
  }
};

// Holds the log files of one test; removed with it.
class LogDir {
 public:
  LogDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "kvferry-pd-fault-XXXXXX");
    path_ = ::mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~LogDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name + ".log"; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Starts `kvferry ARGS...` with stderr appended to `log_path` and reads its hello line.
// `wrapper` runs it inside something (`ip netns exec NS`); it must exec the program, so that
// the child's pid is kvferry's.
inline PdProcess spawn_pd(const std::vector<std::string>& args, const std::string& log_path,
                          const std::vector<std::string>& wrapper = {}) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "log=$1; shift; exec \"$@\" 2>>\"$log\"", "sh",
                                   log_path};
  argv.insert(argv.end(), wrapper.begin(), wrapper.end());
  argv.emplace_back(KVFERRY_CLI_PATH);
  argv.insert(argv.end(), args.begin(), args.end());
  PdProcess p{must(ChildProcess::spawn(argv)), {}, log_path};
  // A worker that exits or stalls before its hello fails the test with its own words (the
  // caller sees no "ready" and stops there).
  Result<std::string> hello = p.process.read_line(kHello);
  if (hello.ok()) p.hello = nlohmann::json::parse(*hello, nullptr, false);
  if (!hello.ok() || p.hello.is_discarded() || !p.hello.contains("ready")) {
    ADD_FAILURE() << "kvferry " << (args.empty() ? "" : args.front())
                  << " did not start: " << (hello.ok() ? *hello : hello.status().to_string())
                  << "\nlog:\n"
                  << p.log();
    p.hello = nlohmann::json::object();
  }
  return p;
}

// Flags both worker kinds share in these tests: a small MHA model (1 KiB per token), 16-token
// pages, shm (or `transport`) between the processes.
inline std::vector<std::string> worker_flags(const char* role, int heartbeat_ms,
                                             const std::string& transport = "shm",
                                             int pool_pages = 256) {
  return {role,
          "--model",
          "tiny-mha",
          "--page-tokens",
          "16",
          "--pool-pages",
          std::to_string(pool_pages),
          "--transport",
          transport,
          "--heartbeat-ms",
          std::to_string(heartbeat_ms)};
}

// One decode reply: "done ROOM ok TRANSFER_US PAGES CORRUPT BYTES" or "done ROOM failed WHY".
struct DecodeDone {
  bool ok = false;
  uint64_t pages = 0, corrupt = 0, bytes = 0;
  std::string line;
};

inline DecodeDone parse_decode_done(const std::string& line) {
  DecodeDone d;
  d.line = line;
  std::istringstream in(line);
  std::string verb, result;
  uint64_t room = 0, us = 0;
  in >> verb >> room >> result;
  d.ok = result == "ok";
  if (d.ok) in >> us >> d.pages >> d.corrupt >> d.bytes;
  return d;
}

// Polls `check ROOM` until some but not all of the request's pages hold their final bytes:
// the transfer is under way. Returns how many pages had landed (0 on failure).
inline uint64_t wait_mid_transfer(PdProcess& decode, uint64_t room,
                                  std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::string prefix = "check " + std::to_string(room) + " ";
  while (std::chrono::steady_clock::now() < deadline) {
    EXPECT_TRUE(decode.process.send_line("check " + std::to_string(room)).ok());
    std::string line = decode.wait_line(prefix, 5s);
    std::istringstream in(line.substr(std::min(line.size(), prefix.size())));
    std::string state;
    uint64_t landed = 0, pages = 0;
    in >> state >> landed >> pages;
    if (state == "Transferring" && landed > 0 && landed < pages) return landed;
    if (state != "Transferring" && state != "WaitingForInput" && state != "Bootstrapping") {
      ADD_FAILURE() << "room " << room << " is not in flight: " << line;
      return 0;
    }
    std::this_thread::sleep_for(20ms);
  }
  ADD_FAILURE() << "room " << room << " never got part way within " << timeout.count() << " ms";
  return 0;
}

// A `kvferry bootstrap` process per test, and prefill/decode processes registered with it.
class PdFaultTest : public ::testing::Test {
 protected:
  static constexpr int kHeartbeatMs = 500;
  static constexpr int kChunkTokens = 16;           // one page per chunk
  static constexpr uint64_t kBytesPerToken = 1024;  // tiny-mha: 2 x 4 layers x 4 heads x 16 x 2

  void SetUp() override {
    bootstrap_.emplace(
        spawn_pd({"bootstrap", "--rank-stale-after-ms", "1500"}, logs_.file("bootstrap")));
    address_ = bootstrap_->hello.value("address", "");
    ASSERT_FALSE(address_.empty()) << bootstrap_->hello.dump();
  }

  // `chunk_delay_ms` per one-page chunk keeps a request in flight long enough to hurt it.
  PdProcess start_prefill(int chunk_delay_ms, int heartbeat_ms = kHeartbeatMs) {
    auto args = worker_flags("pd-prefill", heartbeat_ms, transport_, pool_pages_);
    args.insert(args.end(),
                {"--bootstrap", address_, "--chunk-tokens", std::to_string(chunk_tokens_),
                 "--chunk-delay-ms", std::to_string(chunk_delay_ms)});
    return spawn_pd(args, logs_.file("prefill" + std::to_string(++spawned_)));
  }
  PdProcess start_decode(std::vector<std::string> extra = {}, int heartbeat_ms = kHeartbeatMs) {
    auto args = worker_flags("pd-decode", heartbeat_ms, transport_, pool_pages_);
    args.insert(args.end(), extra.begin(), extra.end());
    return spawn_pd(args, logs_.file("decode" + std::to_string(++spawned_)));
  }
  // Routes one request to both sides, as a serving stack's router would.
  void route(PdProcess& prefill, PdProcess& decode, uint64_t room, uint64_t tokens) {
    ASSERT_TRUE(decode.process
                    .send_line("req " + std::to_string(room) + " " + std::to_string(tokens) + " " +
                               address_)
                    .ok());
    ASSERT_TRUE(
        prefill.process.send_line("req " + std::to_string(room) + " " + std::to_string(tokens))
            .ok());
  }
  // Routes a request and checks that decode verified every page and prefill saw Success.
  void expect_verified(PdProcess& prefill, PdProcess& decode, uint64_t room, uint64_t tokens) {
    route(prefill, decode, room, tokens);
    DecodeDone d = parse_decode_done(decode.wait_line("done " + std::to_string(room) + " ", 15s));
    EXPECT_TRUE(d.ok) << d.line << "\n" << decode.log();
    EXPECT_EQ(d.pages, (tokens + 15) / 16) << d.line;
    EXPECT_EQ(d.corrupt, 0u) << d.line;
    EXPECT_EQ(d.bytes, tokens * kBytesPerToken) << d.line;
    EXPECT_EQ(prefill.wait_line("done " + std::to_string(room) + " ", 5s),
              "done " + std::to_string(room) + " ok");
  }

  std::string transport_ = "shm";  // between prefill and decode
  int chunk_tokens_ = kChunkTokens;
  int pool_pages_ = 256;
  LogDir logs_;
  std::optional<PdProcess> bootstrap_;
  std::string address_;
  int spawned_ = 0;
};

}  // namespace kvferry::testing
