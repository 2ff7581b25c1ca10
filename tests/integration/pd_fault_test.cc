// PD faults across real processes (`kvferry bootstrap`, `pd-prefill`, `pd-decode`): a peer
// killed, hung or restarted mid-transfer, and an abort. Each test is bounded (well under
// 20 s) and checks what matters: which side fails with which code, within which time, and
// that the pages decode ends up with are right (or, after an abort, untouched).
#include <signal.h>

#include "integration/pd_fault_support.h"

namespace kvferry::testing {
namespace {

// Ten one-page chunks, 150 ms apart: about 1.5 s in flight, so a fault lands mid-transfer.
constexpr uint64_t kSlowTokens = 160;
constexpr int kSlowChunkMs = 150;

TEST_F(PdFaultTest, DecodeKilledMidTransferFailsItsRequestsAndPrefillServesAnotherDecode) {
  PdProcess prefill = start_prefill(kSlowChunkMs);
  PdProcess doomed = start_decode();
  route(prefill, doomed, 1, kSlowTokens);
  ASSERT_GT(wait_mid_transfer(doomed, 1), 0u);
  doomed.process.kill_now();

  const std::string failed = prefill.wait_line("done 1 ", 5s);
  EXPECT_TRUE(contains(failed, "done 1 failed PeerDisconnected")) << failed;

  PdProcess next = start_decode();
  expect_verified(prefill, next, 2, kSlowTokens);
}

TEST_F(PdFaultTest, KilledPrefillFailsDecodeRequestsWithinTwoHeartbeats) {
  PdProcess prefill = start_prefill(kSlowChunkMs);
  PdProcess decode = start_decode();
  route(prefill, decode, 1, kSlowTokens);
  ASSERT_GT(wait_mid_transfer(decode, 1), 0u);
  prefill.process.kill_now();  // returns once the process is reaped: its sockets are closed
  const auto killed = std::chrono::steady_clock::now();

  const std::string failed = decode.wait_line("done 1 ", 5s);
  const auto noticed = std::chrono::steady_clock::now() - killed;
  RecordProperty("noticed_ms", static_cast<int>(noticed / 1ms));
  EXPECT_LT(noticed, 2 * std::chrono::milliseconds(kHeartbeatMs));
  EXPECT_TRUE(contains(failed, "done 1 failed PeerDisconnected")) << failed;

  // A prefill started again for the same instance registers anew and is used.
  PdProcess restarted = start_prefill(0);
  expect_verified(restarted, decode, 2, 64);
}

// A hung prefill (SIGSTOP: its sockets stay open) is noticed by silence alone.
TEST_F(PdFaultTest, HungPrefillFailsDecodeRequestsWithinTwoHeartbeats) {
  constexpr int kSlowHeartbeatMs = 1000;  // the silence check has a quarter interval of slack
  PdProcess prefill = start_prefill(kSlowChunkMs, kSlowHeartbeatMs);
  PdProcess decode = start_decode({}, kSlowHeartbeatMs);
  route(prefill, decode, 1, kSlowTokens);
  ASSERT_GT(wait_mid_transfer(decode, 1), 0u);
  ASSERT_EQ(::kill(prefill.process.pid(), SIGSTOP), 0);
  const auto hung = std::chrono::steady_clock::now();

  const std::string failed = decode.wait_line("done 1 ", 5s);
  const auto noticed = std::chrono::steady_clock::now() - hung;
  RecordProperty("noticed_ms", static_cast<int>(noticed / 1ms));
  EXPECT_LT(noticed, 2 * std::chrono::milliseconds(kSlowHeartbeatMs));
  EXPECT_TRUE(contains(failed, "done 1 failed PeerDisconnected")) << failed;
  prefill.process.kill_now();
}

// After the abort-ack decode watches the pages for twice the chunk interval (pd-decode's
// `abort`): a chunk written late would change them.
TEST_F(PdFaultTest, AbortedRequestPagesAreNotWrittenAfterTheAbortAck) {
  PdProcess prefill = start_prefill(kSlowChunkMs);
  PdProcess decode = start_decode();
  route(prefill, decode, 1, kSlowTokens);
  ASSERT_GT(wait_mid_transfer(decode, 1), 0u);
  ASSERT_TRUE(decode.process.send_line("abort 1").ok());

  EXPECT_EQ(decode.wait_line("aborted 1 ", 10s), "aborted 1 acked unchanged");
  const std::string failed = prefill.wait_line("done 1 ", 5s);
  EXPECT_TRUE(contains(failed, "done 1 failed Cancelled")) << failed;
  expect_verified(prefill, decode, 2, 64);
}

struct RestartCase {
  const char* name;
  bool same_endpoint;
};

class PdDecodeRestart : public PdFaultTest, public ::testing::WithParamInterface<RestartCase> {};

// The restarted decode reuses the page indices the killed one was receiving into: a write
// of the old request still in flight to the old incarnation must not land in the new one.
TEST_P(PdDecodeRestart, RestartedDecodeRegistersAgainAndSucceeds) {
  PdProcess prefill = start_prefill(kSlowChunkMs);
  PdProcess first = start_decode();
  const std::string endpoint = first.hello.value("endpoint", "");
  ASSERT_FALSE(endpoint.empty()) << first.hello.dump();
  expect_verified(prefill, first, 1, 32);
  route(prefill, first, 2, kSlowTokens);
  ASSERT_GT(wait_mid_transfer(first, 2), 0u);
  first.process.kill_now();
  EXPECT_TRUE(contains(prefill.wait_line("done 2 ", 5s), "failed"));

  std::vector<std::string> listen;
  if (GetParam().same_endpoint) listen = {"--listen", endpoint};
  PdProcess second = start_decode(listen);
  if (GetParam().same_endpoint) {
    EXPECT_EQ(second.hello.value("endpoint", ""), endpoint);
  }
  expect_verified(prefill, second, 3, kSlowTokens);
  expect_verified(prefill, second, 4, 64);
}

INSTANTIATE_TEST_SUITE_P(Endpoints, PdDecodeRestart,
                         ::testing::Values(RestartCase{"SameEndpoint", true},
                                           RestartCase{"NewEndpoint", false}),
                         [](const ::testing::TestParamInfo<RestartCase>& c) {
                           return std::string(c.param.name);
                         });

TEST_F(PdFaultTest, BootstrapCommandStopsOnSigterm) {
  ASSERT_EQ(::kill(bootstrap_->process.pid(), SIGTERM), 0);
  EXPECT_EQ(must(bootstrap_->process.finish(5s)), 0);
  EXPECT_TRUE(contains(bootstrap_->log(), "signalled, stopped")) << bootstrap_->log();
}

}  // namespace
}  // namespace kvferry::testing
