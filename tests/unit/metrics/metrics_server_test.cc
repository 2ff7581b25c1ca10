// MetricsServer: /metrics over HTTP in Prometheus text format, that promtool accepts, with
// the bytes an engine moved; the in-process histogram's buckets.
#include "kvferry/metrics_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/metrics_histogram.h"
#include "core/net.h"
#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

TEST(LatencyHistogram, PutsEachObservationInTheFirstBucketNotBelowIt) {
  LatencyHistogram h;
  h.observe(std::chrono::nanoseconds(1024));  // <= 2^10 ns: bucket 0
  h.observe(std::chrono::nanoseconds(1025));  // bucket 1
  h.observe(std::chrono::microseconds(3));    // 3000 ns <= 4096: bucket 2
  h.observe(std::chrono::seconds(100));       // past the last bound: +Inf only
  MetricPoint p = h.to_point({});
  ASSERT_EQ(p.cumulative_counts.size(), static_cast<size_t>(LatencyHistogram::kBounds));
  EXPECT_EQ(p.cumulative_counts[0], 1u);
  EXPECT_EQ(p.cumulative_counts[1], 2u);
  EXPECT_EQ(p.cumulative_counts[2], 3u);
  EXPECT_EQ(p.cumulative_counts.back(), 3u);
  EXPECT_EQ(p.count, 4u);
  EXPECT_NEAR(p.sum, 100.0 + 5049e-9, 1e-9);
  EXPECT_DOUBLE_EQ(LatencyHistogram::bounds_seconds()[0], 1024e-9);
}

TEST(MetricsServer, MalformedOrBusyAddressIsAnErrorNamingIt) {
  Result<std::unique_ptr<MetricsServer>> bad = MetricsServer::start("no-port");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(bad.status().message(), "no-port")) << bad.status().message();
  std::unique_ptr<MetricsServer> first = must(MetricsServer::start("127.0.0.1:0"));
  Result<std::unique_ptr<MetricsServer>> busy = MetricsServer::start(first->address());
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kInternal);
  EXPECT_TRUE(contains(busy.status().message(), first->address())) << busy.status().message();
}

TEST(MetricsServer, ServesTheBytesAnEngineMovedInATextPromtoolAccepts) {
  EngineOptions options;
  options.name = "scraped";
  options.metrics = true;
  std::unique_ptr<TransferEngine> engine = must(TransferEngine::create(options));
  std::vector<std::byte> a(1 << 16), b(1 << 16);
  fill_pattern(a, 5);
  ASSERT_TRUE(engine->register_memory(a.data(), a.size()).ok());
  ASSERT_TRUE(engine->register_memory(b.data(), b.size()).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(a.data()),
                reinterpret_cast<uint64_t>(b.data()), 12345};
  ASSERT_TRUE(engine->transfer_sync(self, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(std::span(b).first(12345), 5).has_value());

  std::unique_ptr<MetricsServer> server = must(MetricsServer::start("127.0.0.1:0"));
  int id = server->add_source([&] { return engine->metrics(); });
  Endpoint at = must(parse_endpoint(server->address()));
  httplib::Client client(at.host, at.port);
  client.set_connection_timeout(5);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/metrics");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  ASSERT_EQ(res->status, 200);
  const std::string& text = res->body;
  EXPECT_TRUE(contains(text, "# TYPE kvferry_engine_bytes_total counter")) << text;
  EXPECT_TRUE(contains(
      text,
      "kvferry_engine_bytes_total{engine=\"scraped\",transport=\"local\",direction=\"write\"} "
      "12345"))
      << text;
  EXPECT_TRUE(contains(text,
                       "kvferry_engine_batch_latency_seconds_count{engine=\"scraped\","
                       "transport=\"local\"} 1"))
      << text;
  // The same text as in-process.
  EXPECT_TRUE(contains(text, to_prometheus_text(engine->metrics()))) << text;

  // promtool (Debian's prometheus package, installed by scripts/setup.sh) lints it.
  if (!std::filesystem::exists("/usr/bin/promtool")) GTEST_SKIP() << "promtool not installed";
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / ("kvferry-metrics-" + std::to_string(getpid()));
  std::ofstream(file) << text;
  const std::string command = "/usr/bin/promtool check metrics < " + file.string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string lint;
  char buf[256];
  while (fgets(buf, sizeof buf, pipe) != nullptr) lint += buf;
  const int rc = pclose(pipe);
  std::filesystem::remove(file);
  EXPECT_EQ(rc, 0) << lint;

  server->remove_source(id);
  httplib::Result empty = client.Get("/metrics");
  ASSERT_TRUE(empty);
  EXPECT_FALSE(contains(empty->body, "kvferry_engine_bytes_total"));
}

}  // namespace
}  // namespace kvferry
