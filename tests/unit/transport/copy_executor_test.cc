// How the copy executor cuts a part that does not run inline (copy_slice_count), splits
// whose slice boundaries fall inside ops of odd sizes or across many spans of mixed lengths
// (every byte arrives, none beyond), and how many threads copy one part at once (the
// workers and a waiter, at most max_copiers).
#include "transport/local/copy_executor.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "test_batch.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;
using testing::TestBatch;

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

// Thousands of spans of mixed lengths, a part split into slices whose boundaries fall at
// span ends and inside spans alike (cut as the slices are claimed): every byte of every span
// arrives, and the gap after each destination stays untouched.
TEST(CopyExecutorSplit, SlicesCutAcrossManySpansOfMixedLengthsMoveExactlyTheBytes) {
  constexpr std::array<size_t, 5> kLengths = {1, 4095, 65'539, 7, 300'001};
  constexpr size_t kSpans = 400;  // 80 rounds of the lengths: about 29 MiB
  constexpr size_t kGap = 64;
  size_t total = 0;
  for (size_t i = 0; i < kSpans; ++i) total += kLengths[i % kLengths.size()];
  std::vector<std::byte> src(total);
  fill_pattern(src, 23);
  std::vector<std::byte> dst(total + kSpans * kGap, std::byte{0});
  std::vector<ResolvedOp> spans;
  size_t from = 0, to = 0;
  for (size_t i = 0; i < kSpans; ++i) {
    ResolvedOp op;
    op.length = kLengths[i % kLengths.size()];
    op.local = reinterpret_cast<char*>(src.data() + from);
    op.remote = reinterpret_cast<char*>(dst.data() + to);
    spans.push_back(op);
    from += op.length;
    to += op.length + kGap;
  }
  ThreadPool pool(2);
  CopyExecutor executor(pool, /*inline_bytes=*/0);
  auto batch =
      std::make_shared<TestBatch>(std::make_shared<PeerLiveness>("self"), std::chrono::seconds(10));
  std::shared_ptr<BatchProgress> progress = batch;
  ASSERT_EQ(copy_slice_count(total, pool.size()), 8u) << "the part must split";
  executor.run(BatchPart{progress, spans, total});
  batch->help_now();
  BatchStatus s = batch->wait_for_end(std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  for (size_t i = 0; i < kSpans; ++i) {
    const ResolvedOp& op = spans[i];
    ASSERT_EQ(std::memcmp(op.remote, op.local, op.length), 0) << "span " << i;
    for (size_t g = 0; g < kGap; ++g) {
      ASSERT_EQ(static_cast<std::byte>(op.remote[op.length + g]), std::byte{0}) << "span " << i;
    }
  }
}

// Copies each chunk with memcpy and counts how many threads are inside at once. Until
// `company` threads have been inside together, a chunk waits (up to a second) for more, so a
// cap that allows them is seen reached even on a loaded machine.
class CountingCopier final : public ChunkCopier {
 public:
  explicit CountingCopier(int company) : company_(company) {}
  Status copy_chunk(std::span<const CopyPiece> pieces) const override {
    const int now = inside_.fetch_add(1) + 1;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
    for (int i = 0; i < 1000 && most_.load() < company_; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (const CopyPiece& p : pieces) {
      std::memcpy(p.span->dst() + p.offset, p.span->src() + p.offset, p.length);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    inside_.fetch_sub(1);
    return Status::Ok();
  }
  int most() const { return most_.load(); }

 private:
  const int company_;
  mutable std::atomic<int> inside_{0}, most_{0};
};

// Three workers and a helping waiter, a part of 24 MiB in 12 slices: at most `cap` copy at once,
// and all of them do when the cap allows; every byte arrives either way.
void copy_with_cap(int cap) {
  SCOPED_TRACE(::testing::Message() << "max_copiers " << cap);
  constexpr size_t kSpan = 1 << 20, kSpans = 24;
  std::vector<std::byte> src(kSpan * kSpans), dst(kSpan * kSpans, std::byte{0});
  fill_pattern(src, 17);
  std::vector<ResolvedOp> spans;
  for (size_t i = 0; i < kSpans; ++i) {
    ResolvedOp op;
    op.local = reinterpret_cast<char*>(src.data() + i * kSpan);
    op.remote = reinterpret_cast<char*>(dst.data() + i * kSpan);
    op.length = kSpan;
    spans.push_back(op);
  }
  ThreadPool pool(3);
  auto copier = std::make_shared<CountingCopier>(std::min(cap, 4));
  CopyExecutor executor(pool, /*inline_bytes=*/0, copier, cap);
  auto batch =
      std::make_shared<TestBatch>(std::make_shared<PeerLiveness>("self"), std::chrono::seconds(10));
  std::shared_ptr<BatchProgress> progress = batch;
  ASSERT_EQ(copy_slice_count(kSpan * kSpans, pool.size()), 12u);
  executor.run(BatchPart{progress, spans, kSpan * kSpans});
  batch->help_now();  // the waiter: a fourth thread that may copy
  BatchStatus s = batch->wait_for_end(std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(copier->most(), std::min(cap, 4));
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), dst.size()), 0);
}

TEST(CopyExecutorCopiers, NoMoreThreadsCopyOnePartAtOnceThanTheCap) {
  for (int cap : {1, 2, 4, 8}) copy_with_cap(cap);
}

TEST(CopyExecutorCopiers, TheDefaultCapIsTheCpusThisProcessMayUse) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(usable_cpu_count(), CPU_COUNT(&set));
}

}  // namespace
}  // namespace kvferry
