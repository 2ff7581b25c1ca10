// The target's own check on the ucx active-message path, seen from a peer that skips the
// initiator's checks (a buggy or stale peer): two UCX workers in this process over UCX's
// tcp transport on loopback, a channel posting jobs straight to the target's worker. Ranges
// outside the target's registered region are refused by the target (NotRegistered) and not
// one byte outside it changes; ranges inside it arrive intact; writes too close to their
// deadline are refused (Timeout). Without UCX in the build
// these tests are not compiled.
#ifdef KVFERRY_WITH_UCX
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "core/pattern.h"
#include "test_batch.h"
#include "test_support.h"
#include "transport/ucx/ucx_channel.h"
#include "transport/ucx/ucx_worker.h"

namespace kvferry::detail {
namespace {

using testing::must;
using testing::TestBatch;

class UcxAmTarget : public ::testing::Test {
 protected:
  static constexpr uint64_t kRegionBytes = 1 << 20;
  static constexpr uint64_t kBufferBytes = 2 * kRegionBytes;  // the second half: unregistered

  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);  // not the veths other tests create and remove
    target_memory_.resize(kBufferBytes);
    fill_pattern(target_memory_, 5);
    RegionEntry region;
    region.addr = target_addr();
    region.length = kRegionBytes;
    region.host_ptr = reinterpret_cast<char*>(target_memory_.data());
    region.use = use_;
    regions_ = std::make_shared<const RegionIndex>(RegionEntries{region});
    target_ = must(UcxWorker::create(
        "am-target", [this] { return regions_; }, false));
    initiator_ = must(UcxWorker::create(
        "am-initiator", [] { return std::make_shared<const RegionIndex>(); }, false));
    liveness_ = std::make_shared<PeerLiveness>("am-target");
    channel_ = std::make_shared<UcxChannel>(*initiator_, "am-target", target_->address(), liveness_,
                                            UcxDataPath::kActiveMessages);
  }
  void TearDown() override {
    initiator_
        ->call([this] {
          channel_->shut(PeerDisconnected("test over"));
          channel_.reset();  // the worker keeps it until its endpoint is closed
          return Status::Ok();
        })
        .ignore();
    initiator_.reset();
    target_.reset();
    ::unsetenv("UCX_TLS");
    ::unsetenv("UCX_NET_DEVICES");
  }
  uint64_t target_addr() const { return reinterpret_cast<uint64_t>(target_memory_.data()); }

  // Runs one op through the channel, as UcxLink::post would without its region check.
  BatchStatus run(OpKind kind, std::vector<std::byte>& local, uint64_t remote, uint64_t length,
                  std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    auto batch = std::make_shared<TestBatch>(liveness_, timeout);
    auto job = std::make_shared<UcxJob>();
    job->batch = batch;
    job->ops.push_back(
        UcxOp{kind, reinterpret_cast<char*>(local.data()), remote, length, target_addr(), &rkey_});
    batch->add_tasks(1);
    initiator_->post([channel = channel_, job]() mutable {
      channel->enqueue(std::make_unique<UcxJob>(std::move(*job)));
    });
    return batch->wait_for_end(std::chrono::seconds(20));
  }

  std::vector<std::byte> target_memory_;
  std::shared_ptr<RegionUse> use_ = std::make_shared<RegionUse>();
  std::shared_ptr<const RegionIndex> regions_;
  std::string rkey_;  // unused on the active-message path
  std::unique_ptr<UcxWorker> target_;
  std::unique_ptr<UcxWorker> initiator_;
  std::shared_ptr<PeerLiveness> liveness_;
  std::shared_ptr<UcxChannel> channel_;
};

TEST_F(UcxAmTarget, WritesOutsideOrStraddlingTheRegionAreRefusedByTheTargetAndWriteNothing) {
  std::vector<std::byte> src(kRegionBytes);
  fill_pattern(src, 9);
  struct Case {
    uint64_t offset, length;
  };
  // Just past the end and straddling it (eager sizes), and 1 MiB past it (rendezvous).
  for (Case c : {Case{kRegionBytes, 4096}, Case{kRegionBytes - 2048, 4096},
                 Case{kRegionBytes, kRegionBytes}}) {
    BatchStatus s = run(OpKind::kWrite, src, target_addr() + c.offset, c.length);
    ASSERT_EQ(s.state, BatchState::kFailed) << c.offset;
    EXPECT_EQ(s.status.code(), StatusCode::kNotRegistered) << s.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(target_memory_, 5)) << "the target's memory changed";
  }
  EXPECT_EQ(use_->in_flight.load(), 0);
  // Inside the region: the bytes arrive (and nothing around them changes).
  BatchStatus ok = run(OpKind::kWrite, src, target_addr() + 4096, 8192);
  ASSERT_EQ(ok.state, BatchState::kCompleted) << ok.status.to_string();
  std::vector<std::byte> expected(kBufferBytes);
  fill_pattern(expected, 5);
  std::copy_n(src.begin(), 8192, expected.begin() + 4096);
  EXPECT_EQ(checksum(target_memory_), checksum(expected));
}

TEST_F(UcxAmTarget, ReadsOutsideTheRegionAreRefusedByTheTargetAndLandNothing) {
  std::vector<std::byte> dst(kRegionBytes, std::byte{0});
  BatchStatus s = run(OpKind::kRead, dst, target_addr() + kRegionBytes - 1, 2);
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kNotRegistered) << s.status.to_string();
  EXPECT_TRUE(std::all_of(dst.begin(), dst.end(), [](std::byte b) { return b == std::byte{0}; }));
  // Inside: eager and rendezvous sizes arrive intact.
  for (uint64_t length : {uint64_t{512}, kRegionBytes}) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    BatchStatus ok = run(OpKind::kRead, dst, target_addr(), length);
    ASSERT_EQ(ok.state, BatchState::kCompleted) << ok.status.to_string();
    std::vector<std::byte> expected(kBufferBytes);
    fill_pattern(expected, 5);
    EXPECT_TRUE(
        std::equal(dst.begin(), dst.begin() + static_cast<ptrdiff_t>(length), expected.begin()))
        << length;
  }
}

// A write that reaches the target less than the landing margin before its deadline could
// still be copying when the initiator reports Timeout: the target refuses it, eager and
// rendezvous sizes alike, and not one byte changes.
TEST_F(UcxAmTarget, WritesArrivingWithinTheLandingMarginOfTheirDeadlineAreRefusedAndWriteNothing) {
  std::vector<std::byte> src(kRegionBytes);
  fill_pattern(src, 9);
  // The first write (with time to spare) measures the clock offset to the target.
  BatchStatus first = run(OpKind::kWrite, src, target_addr(), 4096);
  ASSERT_EQ(first.state, BatchState::kCompleted) << first.status.to_string();
  fill_pattern(target_memory_, 5);
  for (uint64_t length : {uint64_t{4096}, kRegionBytes}) {
    BatchStatus s = run(OpKind::kWrite, src, target_addr(), length, std::chrono::milliseconds(1));
    ASSERT_EQ(s.state, BatchState::kFailed) << length;
    EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(target_memory_, 5)) << "the target's memory changed";
  }
}

}  // namespace
}  // namespace kvferry::detail
#endif  // KVFERRY_WITH_UCX
