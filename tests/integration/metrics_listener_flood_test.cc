// Idle and churning clients against the Prometheus /metrics listener: it is served by one
// epoll loop under ListenerLimits like the other listeners, so a connection that never sends
// its request holds a few bytes, never the thread that answers scrapes. The crowd comes from
// other loopback addresses (127.0.0.2 and up); the scraper from 127.0.0.1, each scrape with
// its own short timeout.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "hostile_clients.h"
#include "kvferry/metrics_server.h"
#include "test_support.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kCounterName = "kvferry_flood_test_scrapes_total";
constexpr size_t kMetricsIdleClients = 300;
constexpr size_t kMetricsCrowdSources = 10;  // 30 connections per source, under the default 64
constexpr int kScrapes = 50;
constexpr double kMinScrapeSuccess = 0.9;

MetricsSnapshot one_counter() {
  MetricsSnapshot snapshot;
  MetricFamily family;
  family.name = kCounterName;
  family.help = "A counter that the scrapes look for.";
  family.type = MetricType::kCounter;
  MetricPoint point;
  point.labels = {{"test", "flood"}};
  point.value = 42;
  family.points.push_back(point);
  snapshot.families.push_back(family);
  return snapshot;
}

// One scrape from 127.0.0.1, allowed `timeout` in all; whether the counter came back.
bool scrape(const Endpoint& server, std::chrono::milliseconds timeout) {
  httplib::Client client(server.host, server.port);
  client.set_connection_timeout(timeout);
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  httplib::Result res = client.Get("/metrics");
  return res && res->status == 200 && contains(res->body, std::string(kCounterName) + "{");
}

TEST(MetricsListenerIdleFlood, OneIdleConnectionDoesNotBlockAScrape) {
  std::unique_ptr<MetricsServer> server = must(MetricsServer::start("127.0.0.1:0"));
  server->add_source(one_counter);
  const Endpoint endpoint = must(parse_endpoint(server->address()));
  HostileCrowd idle(endpoint, 1, 1);
  ASSERT_EQ(idle.connected(), 1u);
  const auto started = Clock::now();
  EXPECT_TRUE(scrape(endpoint, 500ms));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  EXPECT_LT(took, 500ms);
  std::printf("one idle connection held: scrape took %lld ms\n",
              static_cast<long long>(took.count()));
}

TEST(MetricsListenerIdleFlood, NineInTenScrapesSucceedWhileIdleConnectionsAreHeldAndConnectsFlood) {
  std::unique_ptr<MetricsServer> server = must(MetricsServer::start("127.0.0.1:0"));
  server->add_source(one_counter);
  const Endpoint endpoint = must(parse_endpoint(server->address()));
  std::atomic<bool> stop{false};
  std::atomic<bool> crowd_in{false};
  std::atomic<uint64_t> churned{0};
  // Hundreds of idle connections, reopened before the listener's 2 s deadline closes them.
  std::thread holders([&] {
    while (!stop) {
      HostileCrowd idle(endpoint, kMetricsIdleClients, kMetricsCrowdSources);
      crowd_in = true;
      for (int i = 0; i < 15 && !stop; ++i) std::this_thread::sleep_for(100ms);
    }
  });
  // Connections opened and closed as fast as one thread can.
  std::thread churn([&] {
    while (!stop) {
      Fd fd = connect_from("127.0.0." + std::to_string(2 + kMetricsCrowdSources), endpoint);
      if (fd.valid()) ++churned;
    }
  });
  // The scrapes begin once the idle crowd is connected and the churn under way.
  for (int i = 0; i < 1000 && !(crowd_in && churned > 0); ++i) std::this_thread::sleep_for(10ms);
  const bool flooding = crowd_in && churned > 0;
  int succeeded = 0;
  std::chrono::milliseconds slowest{0};
  for (int i = 0; flooding && i < kScrapes; ++i) {
    const auto started = Clock::now();
    if (scrape(endpoint, 1s)) ++succeeded;
    slowest = std::max(
        slowest, std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started));
    std::this_thread::sleep_for(50ms);
  }
  stop = true;
  holders.join();
  churn.join();
  std::printf(
      "%d of %d scrapes succeeded (slowest %lld ms) beside %zu held idle connections "
      "and %llu churned connects\n",
      succeeded, kScrapes, static_cast<long long>(slowest.count()), kMetricsIdleClients,
      static_cast<unsigned long long>(churned.load()));
  ASSERT_TRUE(flooding) << "the idle crowd or the churn did not start";
  EXPECT_GE(succeeded, static_cast<int>(kScrapes * kMinScrapeSuccess))
      << succeeded << " of " << kScrapes << " scrapes succeeded";
  EXPECT_GT(churned.load(), 0u);
}

TEST(MetricsListener, AnswersOnlyGetOfTheMetricsPath) {
  std::unique_ptr<MetricsServer> server = must(MetricsServer::start("127.0.0.1:0"));
  server->add_source(one_counter);
  const Endpoint endpoint = must(parse_endpoint(server->address()));
  httplib::Client client(endpoint.host, endpoint.port);
  client.set_connection_timeout(2s);
  client.set_read_timeout(2s);
  httplib::Result other = client.Get("/other");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  httplib::Result post = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  httplib::Result ok = client.Get("/metrics?name=x");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_TRUE(contains(ok->body, std::string(kCounterName) + "{test=\"flood\"} 42")) << ok->body;
}

}  // namespace
}  // namespace kvferry::testing
