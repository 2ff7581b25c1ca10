// Engine notifications to a real second process (`kvferry serve`): a batch's notification is
// acknowledged by the child (it is in the child's inbox) only after the child holds every
// byte, on cma and tcp; a killed child fails the next notification with PeerDisconnected
// within a bounded time instead of hanging.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "core/pattern.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry {
namespace {

using cli::ServePeer;
using cli::start_serve_peer;
using testing::make_engine;
using testing::must;

constexpr auto kReply = std::chrono::seconds(60);

class NotificationTwoProcess : public ::testing::TestWithParam<TransportKind> {};

TEST_P(NotificationTwoProcess, ABatchIsCompleteOnlyOnceTheChildHoldsItsBytesAndNotification) {
  constexpr uint64_t kBytes = 8u << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes, {"--memory", "host"}));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint, PeerOptions{GetParam()}));
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 41);
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, kBytes};
  SubmitOptions options;
  options.notification = "all yours";
  ASSERT_TRUE(engine->transfer_sync(handle, {&op, 1}, options).ok());
  auto verified = peer.process.ask(fmt::format("verify 41 0 {}", kBytes), kReply);
  ASSERT_TRUE(verified.ok()) << verified.status().to_string();
  EXPECT_EQ(*verified, "ok");
  EXPECT_TRUE(engine->send_notification(handle, "standalone").ok());
}

INSTANTIATE_TEST_SUITE_P(Transports, NotificationTwoProcess,
                         ::testing::Values(TransportKind::kCma, TransportKind::kTcp),
                         [](const ::testing::TestParamInfo<TransportKind>& param_info) {
                           return std::string(transport_kind_name(param_info.param));
                         });

TEST(NotificationTwoProcessDeath, AKilledTargetFailsTheNextNotificationPromptly) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20, {"--memory", "host"}));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint, PeerOptions{TransportKind::kTcp}));
  ASSERT_TRUE(engine->send_notification(handle, "hello").ok());
  peer.process.kill_now();
  Status s = engine->send_notification(handle, "are you there", std::chrono::seconds(10));
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
}

}  // namespace
}  // namespace kvferry
