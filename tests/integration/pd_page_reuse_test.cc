// Pages decode gave up are never written afterwards. Decode aborts a request mid-transfer
// (or times it out, which aborts it too) and, the moment prefill acknowledges, reuses its
// pages: pd-decode overwrites them with a watch pattern and checks it stayed (a write of the
// old request landing late changes it), then the next request gets the same pages (the
// allocator hands the released pages out first) and decode verifies every byte of it. Many
// repetitions over tcp and shm, each bounded; prefill keeps several chunks in flight (no
// compute delay to speak of) so that the abort meets writes under way.
#include "integration/pd_fault_support.h"

namespace kvferry::testing {
namespace {

constexpr int kRepetitions = 25;
constexpr uint64_t kSlowTokens = 2048;  // 128 pages in 32 chunks of 4 pages
constexpr int kChunkMs = 2;
constexpr int kTimeoutMs = 40;  // decode's waiting timeout in the timeout case

class PdPageReuse : public PdFaultTest, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    transport_ = GetParam();
    chunk_tokens_ = 64;
    PdFaultTest::SetUp();
  }
};

TEST_P(PdPageReuse, AbortedRequestPagesAreNotWrittenAfterTheAckAndServeTheNextRequest) {
  PdProcess prefill = start_prefill(kChunkMs);
  PdProcess decode = start_decode();
  int aborted_mid_transfer = 0;
  for (int rep = 0; rep < kRepetitions && !HasFailure(); ++rep) {
    const uint64_t room = 2 * rep + 1;
    route(prefill, decode, room, kSlowTokens);
    if (wait_mid_transfer(decode, room) == 0) break;
    ASSERT_TRUE(decode.process.send_line("abort " + std::to_string(room)).ok());
    EXPECT_EQ(decode.wait_line("aborted " + std::to_string(room) + " ", 10s),
              "aborted " + std::to_string(room) + " acked unchanged")
        << "repetition " << rep;
    EXPECT_TRUE(contains(prefill.wait_line("done " + std::to_string(room) + " ", 10s), "failed"));
    ++aborted_mid_transfer;
    // Same size: the same pages, now another request's.
    expect_verified(prefill, decode, room + 1, kSlowTokens);
  }
  EXPECT_EQ(aborted_mid_transfer, kRepetitions);
}

TEST_P(PdPageReuse, TimedOutRequestPagesAreNotWrittenAfterTheAckAndServeTheNextRequest) {
  PdProcess prefill = start_prefill(2 * kChunkMs);  // about 130 ms: three times the timeout
  PdProcess decode = start_decode({"--waiting-timeout-ms", std::to_string(kTimeoutMs),
                                   "--watch-released-ms", "200"});
  int timed_out = 0;
  for (int rep = 0; rep < kRepetitions && !HasFailure(); ++rep) {
    const uint64_t room = 2 * rep + 1;
    const std::string r = std::to_string(room);
    route(prefill, decode, room, kSlowTokens);
    const std::string done = decode.wait_line("done " + r + " ", 15s);
    if (contains(done, "ok")) continue;  // finished within the timeout: nothing to check
    EXPECT_TRUE(contains(done, "done " + r + " failed Timeout")) << done;
    EXPECT_EQ(decode.wait_line("released " + r + " ", 30s), "released " + r + " unchanged")
        << "repetition " << rep;
    EXPECT_TRUE(contains(prefill.wait_line("done " + r + " ", 10s), "failed"));
    ++timed_out;
    // One chunk, well within the timeout, into the first of the released pages.
    expect_verified(prefill, decode, room + 1, 64);
  }
  EXPECT_GT(timed_out, kRepetitions / 2) << "too few requests timed out to test anything";
}

INSTANTIATE_TEST_SUITE_P(Transports, PdPageReuse, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& c) {
                           return std::string(c.param);
                         });

}  // namespace
}  // namespace kvferry::testing
