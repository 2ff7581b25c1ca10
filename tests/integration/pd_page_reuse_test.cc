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

constexpr int kRepetitions = 60;
constexpr uint64_t kReusedPagesTokens = 4096;  // 256 pages in 16 chunks of 16 pages (256 KiB)
constexpr int kChunkMs = 1;
constexpr char kWatchMs[] = "30";  // late writes come within a chunk's time of the ack
constexpr int kTimeoutMs = 40;     // decode's waiting timeout in the timeout case

// Polls `check ROOM` until the request is part way (true) or already over (false: it was
// quicker than the polling, which the test skips).
bool caught_mid_transfer(PdProcess& decode, uint64_t room) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  const std::string prefix = "check " + std::to_string(room) + " ";
  while (std::chrono::steady_clock::now() < deadline) {
    EXPECT_TRUE(decode.process.send_line("check " + std::to_string(room)).ok());
    std::istringstream in(decode.wait_line(prefix, 5s).substr(prefix.size()));
    std::string state;
    uint64_t landed = 0, pages = 0;
    in >> state >> landed >> pages;
    if (state == "Transferring" && landed > 0 && landed < pages) return true;
    if (state == "unknown" || state == "Success" || state == "Failed" || state.empty()) {
      return false;
    }
    std::this_thread::sleep_for(2ms);
  }
  ADD_FAILURE() << "room " << room << " never got part way";
  return false;
}

class PdPageReuse : public PdFaultTest, public ::testing::WithParamInterface<const char*> {
 protected:
  void SetUp() override {
    transport_ = GetParam();
    chunk_tokens_ = 256;
    pool_pages_ = 1024;
    PdFaultTest::SetUp();
  }
};

TEST_P(PdPageReuse, AbortedRequestPagesAreNotWrittenAfterTheAckAndServeTheNextRequest) {
  PdProcess prefill = start_prefill(kChunkMs);
  PdProcess decode = start_decode({"--watch-released-ms", kWatchMs});
  int aborted_mid_transfer = 0;
  for (int rep = 0; rep < kRepetitions && !HasFailure(); ++rep) {
    const uint64_t room = 2 * rep + 1;
    route(prefill, decode, room, kReusedPagesTokens);
    if (!caught_mid_transfer(decode, room)) {
      decode.wait_line("done " + std::to_string(room) + " ", 10s);
      prefill.wait_line("done " + std::to_string(room) + " ", 10s);
      continue;
    }
    ASSERT_TRUE(decode.process.send_line("abort " + std::to_string(room)).ok());
    EXPECT_EQ(decode.wait_line("aborted " + std::to_string(room) + " ", 10s),
              "aborted " + std::to_string(room) + " acked unchanged")
        << "repetition " << rep;
    // Failed, or ok when its last chunk had landed before the abort reached prefill.
    prefill.wait_line("done " + std::to_string(room) + " ", 10s);
    ++aborted_mid_transfer;
    // Same size: the same pages, now another request's.
    expect_verified(prefill, decode, room + 1, kReusedPagesTokens);
  }
  EXPECT_GT(aborted_mid_transfer, kRepetitions / 2) << "too few aborts met a transfer under way";
}

TEST_P(PdPageReuse, TimedOutRequestPagesAreNotWrittenAfterTheAckAndServeTheNextRequest) {
  PdProcess prefill = start_prefill(8 * kChunkMs);  // over 130 ms: three times the timeout
  PdProcess decode = start_decode(
      {"--waiting-timeout-ms", std::to_string(kTimeoutMs), "--watch-released-ms", kWatchMs});
  int timed_out = 0;
  for (int rep = 0; rep < kRepetitions && !HasFailure(); ++rep) {
    const uint64_t room = 2 * rep + 1;
    const std::string r = std::to_string(room);
    route(prefill, decode, room, kReusedPagesTokens);
    const std::string done = decode.wait_line("done " + r + " ", 15s);
    if (contains(done, "ok")) continue;  // finished within the timeout: nothing to check
    EXPECT_TRUE(contains(done, "done " + r + " failed Timeout")) << done;
    EXPECT_EQ(decode.wait_line("released " + r + " ", 30s), "released " + r + " unchanged")
        << "repetition " << rep;
    prefill.wait_line("done " + r + " ", 10s);  // ok if it finished before the abort came
    ++timed_out;
    // One chunk, well within the timeout, into the first of the released pages: verified, or
    // (a machine too loaded for the short timeout) timed out too, never corrupt.
    route(prefill, decode, room + 1, 64);
    DecodeDone next =
        parse_decode_done(decode.wait_line("done " + std::to_string(room + 1) + " ", 15s));
    if (next.ok) {
      EXPECT_EQ(next.corrupt, 0u) << next.line;
      EXPECT_EQ(next.pages, 4u) << next.line;
    } else {
      EXPECT_TRUE(contains(next.line, "failed Timeout")) << next.line;
    }
    prefill.wait_line("done " + std::to_string(room + 1) + " ", 10s);
  }
  EXPECT_GE(timed_out, kRepetitions / 4) << "too few requests timed out to test anything";
}

INSTANTIATE_TEST_SUITE_P(Transports, PdPageReuse, ::testing::Values("tcp", "shm"),
                         [](const ::testing::TestParamInfo<const char*>& c) {
                           return std::string(c.param);
                         });

}  // namespace
}  // namespace kvferry::testing
