// A real Prometheus server (Debian's prometheus package) scrapes an engine's MetricsServer on
// loopback, and the server's HTTP API reports the bytes counter moved by exactly the bytes
// this test transferred. Prometheus listens on 127.0.0.1:$KVFERRY_PROMETHEUS_PORT (9140 by
// default), with its own config and data directory, and is killed at the end.
#include <gtest/gtest.h>
#include <httplib.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "core/child_process.h"
#include "core/pattern.h"
#include "kvferry/metrics_server.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::must;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr auto kPrometheusDeadline = 60s;  // start, first scrape, and the scrape after

uint16_t prometheus_port() {
  const char* env = std::getenv("KVFERRY_PROMETHEUS_PORT");
  return env != nullptr ? static_cast<uint16_t>(std::stoi(env)) : 9140;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The value Prometheus holds for `query` now, if it has one.
std::optional<double> query_value(httplib::Client& client, const std::string& query) {
  httplib::Result res = client.Get("/api/v1/query", httplib::Params{{"query", query}}, {});
  if (!res || res->status != 200) return std::nullopt;
  nlohmann::json body = nlohmann::json::parse(res->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") return std::nullopt;
  const nlohmann::json& result = body["data"]["result"];
  if (!result.is_array() || result.empty()) return std::nullopt;
  return std::stod(result[0]["value"][1].get<std::string>());
}

// Polls until Prometheus reports `want` for `query` or the deadline passes; the last value.
std::optional<double> wait_for_value(httplib::Client& client, const std::string& query, double want,
                                     std::chrono::steady_clock::time_point until) {
  std::optional<double> last;
  while (std::chrono::steady_clock::now() < until) {
    last = query_value(client, query);
    if (last && *last == want) return last;
    std::this_thread::sleep_for(250ms);
  }
  return last;
}

TEST(PrometheusScrape, ServerReportsTheBytesTheEngineMoved) {
  if (!std::filesystem::exists(kPrometheus)) GTEST_SKIP() << "prometheus is not installed";
  EngineOptions options;
  options.metrics = true;
  options.name = "decode";
  std::unique_ptr<TransferEngine> decode = must(TransferEngine::create(options));
  options.name = "prefill";
  std::unique_ptr<TransferEngine> prefill = must(TransferEngine::create(options));
  constexpr size_t kBytes = 3u << 20;
  SharedBuffer dst = must(decode->allocate_shared(kBytes));
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 21);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  ASSERT_EQ(peer.transport(), TransportKind::kShm);

  std::unique_ptr<MetricsServer> server = must(MetricsServer::start("127.0.0.1:0"));
  server->add_source([&] { return prefill->metrics(); });

  char dir_pattern[] = "/tmp/kvferry-prometheus-XXXXXX";
  ASSERT_NE(::mkdtemp(dir_pattern), nullptr);
  const std::string dir = dir_pattern;
  const std::string config = dir + "/prometheus.yml";
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                        << "scrape_configs:\n  - job_name: kvferry\n    static_configs:\n"
                        << "      - targets: ['" << server->address() << "']\n";
  const std::string listen = "127.0.0.1:" + std::to_string(prometheus_port());
  ChildProcess prometheus = must(ChildProcess::spawn(
      {"/bin/sh", "-c",
       std::string("exec ") + kPrometheus + " --config.file=" + config + " --storage.tsdb.path=" +
           dir + "/data --web.listen-address=" + listen + " 2>" + dir + "/prometheus.log"}));
  const auto until = std::chrono::steady_clock::now() + kPrometheusDeadline;
  httplib::Client client("127.0.0.1", prometheus_port());
  client.set_connection_timeout(1);
  client.set_read_timeout(2);

  const std::string query =
      "kvferry_engine_bytes_total{engine=\"prefill\",transport=\"shm\",direction=\"write\"}";
  // Scraped once before anything moved ...
  std::optional<double> before = wait_for_value(client, query, 0, until);
  ASSERT_EQ(before, std::optional<double>(0)) << read_file(dir + "/prometheus.log");

  // ... then the transfer, every byte checked ...
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.addr), kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(
      find_pattern_mismatch({static_cast<const std::byte*>(dst.addr), kBytes}, 21).has_value());

  // ... and the server's counter moved by exactly those bytes.
  std::optional<double> after = wait_for_value(client, query, kBytes, until);
  EXPECT_EQ(after, std::optional<double>(kBytes)) << read_file(dir + "/prometheus.log");
  EXPECT_EQ(query_value(client, "up{job=\"kvferry\"}"), std::optional<double>(1));

  prometheus.kill_now();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace kvferry
