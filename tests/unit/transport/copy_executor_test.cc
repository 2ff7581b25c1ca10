// How the copy executor cuts a part that does not run inline (copy_slice_count), and a split
// whose slice boundaries fall inside ops of odd sizes: every byte arrives, none beyond.
#include "transport/local/copy_executor.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;

TEST(CopySliceCount, SlicesAreAtLeastOneMebibyte) {
  EXPECT_EQ(copy_slice_count((4u << 20) + 1, 2), 4u);
  EXPECT_EQ(copy_slice_count(6u << 20, 2), 6u);
  EXPECT_EQ(copy_slice_count(7'500'003, 2), 7u);  // 7.15 MiB: 7 slices of just over 1 MiB
}

TEST(CopySliceCount, AtMostFourPerWorker) {
  EXPECT_EQ(copy_slice_count(8u << 20, 2), 8u);
  EXPECT_EQ(copy_slice_count(16u << 20, 2), 8u);  // 1 MiB x 16: 8 slices of 2 MiB
  EXPECT_EQ(copy_slice_count(64u << 20, 1), 4u);
  EXPECT_EQ(copy_slice_count(64u << 20, 8), 32u);
}

TEST(CopySliceCount, NeverZero) {
  // A part below 1 MiB only reaches the split with a low inline threshold: one slice.
  EXPECT_EQ(copy_slice_count(1, 2), 1u);
  EXPECT_EQ(copy_slice_count(512u << 10, 4), 1u);
  EXPECT_EQ(copy_slice_count(8u << 20, 0), 4u);  // no workers: counted as one
}

TEST(CopyExecutorSplit, SliceBoundariesInsideOddSizedOpsMoveExactlyTheBytes) {
  auto engine = testing::make_engine("split", 2);
  constexpr size_t kOp = 2'500'001;  // three ops: 7.15 MiB, split into 7 slices
  constexpr size_t kOps = 3;
  constexpr size_t kGap = 4096;  // between destinations: must stay untouched
  std::vector<std::byte> src(kOp * kOps);
  fill_pattern(src, 41);
  std::vector<std::byte> dst((kOp + kGap) * kOps, std::byte{0});
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(engine->register_memory(dst.data(), dst.size()).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data() + i * kOp),
                   reinterpret_cast<uint64_t>(dst.data() + i * (kOp + kGap)), kOp});
  }
  ASSERT_GT(kOp * kOps, EngineOptions{}.inline_batch_bytes) << "the batch must split";
  BatchHandle b = must(engine->submit(self, ops));
  BatchStatus s = engine->wait(b, std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.bytes, kOp * kOps);
  for (size_t i = 0; i < kOps; ++i) {
    const std::byte* got = dst.data() + i * (kOp + kGap);
    ASSERT_EQ(std::memcmp(got, src.data() + i * kOp, kOp), 0) << "op " << i;
    for (size_t g = 0; g < kGap; ++g) ASSERT_EQ(got[kOp + g], std::byte{0}) << "op " << i;
  }
}

}  // namespace
}  // namespace kvferry
