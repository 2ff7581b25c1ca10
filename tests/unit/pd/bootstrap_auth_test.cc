// The bootstrap server's trust rules: with a secret every route wants a signed request (no
// replays); without one, a live rank cannot be repointed by another incarnation.
#include "pd/bootstrap_auth.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include "core/net.h"
#include "kvferry/pd/bootstrap.h"
#include "pd/bootstrap_json.h"
#include "test_support.h"

namespace kvferry::pd {
namespace {

RankRegistration rank_at(const std::string& control_endpoint, uint64_t incarnation) {
  RankRegistration reg;
  reg.tp_rank = 0;
  reg.tp_size = 1;
  reg.control_endpoint = control_endpoint;
  reg.engine_endpoint = "127.0.0.1:6000";
  reg.incarnation = incarnation;
  reg.page_size_tokens = 16;
  reg.dtype_bytes = 2;
  return reg;
}

BootstrapServerOptions with_secret(std::string secret) {
  BootstrapServerOptions o;
  o.secret = std::move(secret);
  return o;
}

TEST(BootstrapAuth, WithASecretUnsignedOrWronglySignedRequestsAreRefused) {
  auto server = testing::must(BootstrapServer::start(with_secret("bootstrap-secret")));
  Endpoint e = testing::must(parse_endpoint(server->address()));
  httplib::Client http(e.host, e.port);
  const std::string body = to_json(rank_at("127.0.0.1:5000", 1)).dump();
  auto put = http.Put("/register", body, "application/json");
  ASSERT_TRUE(put);
  EXPECT_EQ(put->status, 401);
  EXPECT_NE(put->body.find("X-Kvferry-Auth"), std::string::npos) << put->body;
  for (const char* path : {"/layout", "/rank?tp_rank=0", "/health"}) {
    auto get = http.Get(path);
    ASSERT_TRUE(get);
    EXPECT_EQ(get->status, 401) << path;
  }
  BootstrapClient wrong(server->address(), std::chrono::milliseconds(2000), "another-secret");
  EXPECT_EQ(wrong.register_rank(rank_at("127.0.0.1:5000", 1)).code(), StatusCode::kUnauthenticated);
  // Nothing was registered by any of them.
  BootstrapClient right(server->address(), std::chrono::milliseconds(2000), "bootstrap-secret");
  EXPECT_EQ(right.layout().status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(right.register_rank(rank_at("127.0.0.1:5000", 1)).ok());
  EXPECT_EQ(testing::must(right.rank(0)).control_endpoint, "127.0.0.1:5000");
  EXPECT_TRUE(testing::must(right.health()).healthy);
}

TEST(BootstrapAuth, ASignedRequestCannotBeReplayedOrAltered) {
  auto server = testing::must(BootstrapServer::start(with_secret("bootstrap-secret")));
  Endpoint e = testing::must(parse_endpoint(server->address()));
  httplib::Client http(e.host, e.port);
  const std::string body = to_json(rank_at("127.0.0.1:5000", 1)).dump();
  const std::string header =
      testing::must(sign_bootstrap_request("bootstrap-secret", "PUT", "/register", body));
  httplib::Headers headers{{kBootstrapAuthHeader, header}};
  auto first = http.Put("/register", headers, body, "application/json");
  ASSERT_TRUE(first);
  EXPECT_EQ(first->status, 200) << first->body;
  auto replay = http.Put("/register", headers, body, "application/json");
  ASSERT_TRUE(replay);
  EXPECT_EQ(replay->status, 401);
  EXPECT_NE(replay->body.find("replayed"), std::string::npos) << replay->body;
  // The same signature over another body (the impostor's endpoint) does not verify.
  const std::string other = to_json(rank_at("127.0.0.1:5999", 2)).dump();
  httplib::Headers fresh{
      {kBootstrapAuthHeader,
       testing::must(sign_bootstrap_request("bootstrap-secret", "PUT", "/register", body))}};
  auto altered = http.Put("/register", fresh, other, "application/json");
  ASSERT_TRUE(altered);
  EXPECT_EQ(altered->status, 401);
  BootstrapClient client(server->address(), std::chrono::milliseconds(2000), "bootstrap-secret");
  EXPECT_EQ(testing::must(client.rank(0)).control_endpoint, "127.0.0.1:5000");
}

TEST(BootstrapAuth, WithoutASecretALiveRankCannotBeRepointed) {
  auto server = testing::must(BootstrapServer::start({}));
  BootstrapClient client(server->address());
  Endpoint live;
  Fd listener = testing::must(listen_tcp({"127.0.0.1", 0}, &live));  // the real rank's port
  ASSERT_TRUE(client.register_rank(rank_at(live.to_string(), 1)).ok());
  ASSERT_TRUE(client.register_rank(rank_at(live.to_string(), 1)).ok());  // its heartbeat
  Status impostor = client.register_rank(rank_at("127.0.0.1:5999", 2));
  EXPECT_EQ(impostor.code(), StatusCode::kAlreadyExists) << impostor.to_string();
  RankRegistration now = testing::must(client.rank(0));
  EXPECT_EQ(now.control_endpoint, live.to_string());
  EXPECT_EQ(now.incarnation, 1u);
  // The real rank goes away (its listener closes): a restarted one takes the rank over.
  listener = Fd();
  ASSERT_TRUE(client.register_rank(rank_at("127.0.0.1:5999", 2)).ok());
  EXPECT_EQ(testing::must(client.rank(0)).incarnation, 2u);
}

// Registration spoofing without a secret: a PUT that keeps a live rank's control endpoint but
// claims a restart is taken only when the rank listening there says it is the new
// incarnation. One that accepts the connection but does not say (here: a bare listener) keeps
// its registration; once nothing listens, the restart is taken.
TEST(BootstrapAuth, WithoutASecretAClaimedRestartOfALiveRankIsRefused) {
  auto server = testing::must(BootstrapServer::start({}));
  BootstrapClient client(server->address());
  Endpoint live;
  Fd listener = testing::must(listen_tcp({"127.0.0.1", 0}, &live));
  ASSERT_TRUE(client.register_rank(rank_at(live.to_string(), 1)).ok());
  Status restart = client.register_rank(rank_at(live.to_string(), 2));
  EXPECT_EQ(restart.code(), StatusCode::kAlreadyExists) << restart.to_string();
  EXPECT_NE(restart.message().find("changes incarnation to 2, registered 1"), std::string::npos)
      << restart.to_string();
  RankRegistration moved = rank_at(live.to_string(), 1);
  moved.engine_endpoint = "127.0.0.1:6999";
  Status repoint = client.register_rank(moved);
  EXPECT_EQ(repoint.code(), StatusCode::kAlreadyExists) << repoint.to_string();
  EXPECT_NE(repoint.message().find("changes engine_endpoint to 127.0.0.1:6999, registered "
                                   "127.0.0.1:6000"),
            std::string::npos)
      << repoint.to_string();
  EXPECT_EQ(testing::must(client.rank(0)).incarnation, 1u);
  listener = Fd();
  ASSERT_TRUE(client.register_rank(rank_at(live.to_string(), 2)).ok());
  EXPECT_EQ(testing::must(client.rank(0)).incarnation, 2u);
}

}  // namespace
}  // namespace kvferry::pd
