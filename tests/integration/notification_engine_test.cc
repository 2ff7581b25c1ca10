// Engine notifications to a real second process (`kvferry serve`): a batch's notification is
// acknowledged by the child (it is in the child's inbox) only after the child holds every
// byte, on cma and tcp; a stopped child holds up only a batch that waits for its
// acknowledgement; a killed child fails the next notification with PeerDisconnected within a
// bounded time instead of hanging.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

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

// The target stops (SIGSTOP: a GC pause, an overloaded host) before a READ from it whose
// bytes move without its help (cma). NotificationCompletion::kQueued completes the batch with
// the bytes, and the notification reaches the target once it runs again; kAcknowledged
// waits for the target.
TEST(NotificationCompletion, AStoppedTargetHoldsUpOnlyAcknowledgedCompletion) {
  constexpr uint64_t kBytes = 1u << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes, {"--memory", "host"}));
  ASSERT_EQ(must(peer.process.ask(fmt::format("fill 43 0 {}", kBytes), kReply)), "ok");
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint, PeerOptions{TransportKind::kCma}));
  std::vector<std::byte> dst(2 * kBytes);
  ASSERT_TRUE(engine->register_memory(dst.data(), dst.size()).ok());
  const auto at = [&](uint64_t offset) { return reinterpret_cast<uint64_t>(dst.data()) + offset; };
  ASSERT_TRUE(testing::stop_process(peer.process.pid()));
  TransferOp first{OpKind::kRead, at(0), peer.addr, kBytes};
  SubmitOptions queued;
  queued.notification = "queued";
  queued.notification_completion = NotificationCompletion::kQueued;
  BatchHandle b1 = must(engine->submit(handle, {&first, 1}, queued));
  TransferOp second{OpKind::kRead, at(kBytes), peer.addr, kBytes};
  SubmitOptions acknowledged;
  acknowledged.notification = "acknowledged";
  BatchHandle b2 = must(engine->submit(handle, {&second, 1}, acknowledged));
  const BatchStatus s1 = engine->wait(b1, std::chrono::seconds(10));  // a loaded machine's bound
  const BatchState s2 = engine->wait(b2, std::chrono::milliseconds(300)).state;
  ::kill(peer.process.pid(), SIGCONT);
  EXPECT_EQ(s1.state, BatchState::kCompleted) << s1.status.to_string();
  EXPECT_EQ(s2, BatchState::kPending);  // held by the stopped target's acknowledgement
  EXPECT_EQ(engine->wait(b2, kReply).state, BatchState::kCompleted);
  EXPECT_FALSE(find_pattern_mismatch({dst.data(), kBytes}, 43, 0));
  EXPECT_FALSE(find_pattern_mismatch({dst.data() + kBytes, kBytes}, 43, 0));
  // Both arrived, in order: the second was acknowledged, so the first is in the inbox too.
  EXPECT_EQ(must(peer.process.ask("notifications", kReply)),
            "ok initiator:queued initiator:acknowledged");
}

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
