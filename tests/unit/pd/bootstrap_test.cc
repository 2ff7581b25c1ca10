// Bootstrap server over real HTTP: registration, layout, rank lookup, health, and the
// 400/404/503 answers.
#include "kvferry/pd/bootstrap.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include "core/net.h"
#include "test_support.h"

namespace kvferry::pd {
namespace {

RankRegistration rank(uint32_t r, uint32_t size) {
  RankRegistration reg;
  reg.tp_rank = r;
  reg.tp_size = size;
  reg.control_endpoint = "127.0.0.1:" + std::to_string(5000 + r);
  reg.engine_endpoint = "127.0.0.1:" + std::to_string(6000 + r);
  reg.incarnation = 100 + r;
  reg.page_size_tokens = 16;
  reg.dtype_bytes = 2;
  return reg;
}

TEST(Bootstrap, AnswersUnavailableUntilEveryRankRegistered) {
  auto server = testing::must(BootstrapServer::start({}));
  BootstrapClient client(server->address());
  EXPECT_EQ(client.layout().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(client.register_rank(rank(0, 2)).ok());
  EXPECT_EQ(client.layout().status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.rank(0).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_FALSE(testing::must(client.health()).healthy);
  ASSERT_TRUE(client.register_rank(rank(1, 2)).ok());
  InstanceLayout layout = testing::must(client.layout());
  EXPECT_EQ(layout.tp_size, 2u);
  EXPECT_EQ(layout.page_size_tokens, 16u);
  RankRegistration r1 = testing::must(client.rank(1));
  EXPECT_EQ(r1.control_endpoint, "127.0.0.1:5001");
  EXPECT_EQ(r1.incarnation, 101u);
  EXPECT_TRUE(testing::must(client.health()).healthy);
}

TEST(Bootstrap, UnknownRankIs404AndMissingParametersAre400) {
  auto server = testing::must(BootstrapServer::start({}));
  BootstrapClient client(server->address());
  ASSERT_TRUE(client.register_rank(rank(0, 1)).ok());
  EXPECT_EQ(client.rank(5).status().code(), StatusCode::kOutOfRange);
  Endpoint e = testing::must(parse_endpoint(server->address()));
  httplib::Client http(e.host, e.port);
  auto missing = http.Get("/rank");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 400);
  EXPECT_NE(missing->body.find("tp_rank"), std::string::npos);
  auto bad_number = http.Get("/rank?tp_rank=abc");
  ASSERT_TRUE(bad_number);
  EXPECT_EQ(bad_number->status, 400);
  auto no_field = http.Put("/register", R"({"tp_rank": 0})", "application/json");
  ASSERT_TRUE(no_field);
  EXPECT_EQ(no_field->status, 400);
  EXPECT_NE(no_field->body.find("tp_size"), std::string::npos);
  auto not_json = http.Put("/register", "{{{", "application/json");
  ASSERT_TRUE(not_json);
  EXPECT_EQ(not_json->status, 400);
  auto bad_rank = http.Put("/register",
                           R"({"tp_rank": 3, "tp_size": 2, "control_endpoint": "a:1",
                               "engine_endpoint": "a:2", "incarnation": 1, "page_size": 1})",
                           "application/json");
  ASSERT_TRUE(bad_rank);
  EXPECT_EQ(bad_rank->status, 400);
  auto no_route = http.Get("/nothing");
  ASSERT_TRUE(no_route);
  EXPECT_EQ(no_route->status, 404);
  // The server still serves after all of that.
  EXPECT_TRUE(client.rank(0).ok());
}

TEST(Bootstrap, RankThatStopsRegisteringIsReportedStale) {
  BootstrapServerOptions options;
  options.rank_stale_after = std::chrono::milliseconds(100);
  auto server = testing::must(BootstrapServer::start(options));
  BootstrapClient client(server->address());
  ASSERT_TRUE(client.register_rank(rank(0, 1)).ok());
  EXPECT_TRUE(testing::must(client.health()).healthy);
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  HealthReport report = testing::must(client.health());
  EXPECT_FALSE(report.healthy);
  ASSERT_EQ(report.ranks.size(), 1u);
  EXPECT_FALSE(report.ranks[0].alive);
}

TEST(Bootstrap, UnreachableServerIsPeerUnreachable) {
  BootstrapClient client("127.0.0.1:1", std::chrono::milliseconds(200));
  EXPECT_EQ(client.layout().status().code(), StatusCode::kPeerUnreachable);
}

}  // namespace
}  // namespace kvferry::pd
