// SpanRecycler: large span storage goes back to the next large batch, already allocated;
// small storage is not kept; what is kept stays within its bounds, the largest kept first.
#include "engine/span_recycler.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvferry::detail {
namespace {

constexpr size_t kLarge = SpanRecycler::kMinSpans * 4;

TEST(SpanRecycler, LargeStorageComesBackEmptyToTheNextLargeBatch) {
  SpanRecycler recycler;
  ResolvedSpans first = recycler.take(kLarge);
  ASSERT_GE(first.capacity(), kLarge);
  first.resize(kLarge);
  const ResolvedOp* storage = first.data();
  recycler.give(std::move(first));
  EXPECT_EQ(recycler.kept_bytes(), kLarge * sizeof(ResolvedOp));
  ResolvedSpans again = recycler.take(kLarge / 2);
  EXPECT_EQ(again.data(), storage);
  EXPECT_TRUE(again.empty());
  EXPECT_EQ(recycler.kept_bytes(), 0u);
  // Nothing kept is large enough: new storage.
  recycler.give(std::move(again));
  EXPECT_GE(recycler.take(kLarge * 2).capacity(), kLarge * 2);
}

TEST(SpanRecycler, SmallStorageIsNotKept) {
  SpanRecycler recycler;
  ResolvedSpans small;
  small.reserve(SpanRecycler::kMinSpans - 1);
  recycler.give(std::move(small));
  EXPECT_EQ(recycler.kept_bytes(), 0u);
}

TEST(SpanRecycler, TakesTheSmallestThatFits) {
  SpanRecycler recycler;
  for (size_t spans : {kLarge * 4, kLarge, kLarge * 2}) {
    ResolvedSpans s;
    s.reserve(spans);
    recycler.give(std::move(s));
  }
  EXPECT_EQ(recycler.take(kLarge + 1).capacity(), kLarge * 2);
}

TEST(SpanRecycler, OverItsBoundsTheSmallestGo) {
  SpanRecycler recycler;
  // More than kMaxKept: the smallest are dropped, the largest stay.
  for (size_t i = 1; i <= SpanRecycler::kMaxKept + 3; ++i) {
    ResolvedSpans s;
    s.reserve(SpanRecycler::kMinSpans * i);
    recycler.give(std::move(s));
  }
  size_t expected = 0;
  for (size_t i = 4; i <= SpanRecycler::kMaxKept + 3; ++i) expected += SpanRecycler::kMinSpans * i;
  EXPECT_EQ(recycler.kept_bytes(), expected * sizeof(ResolvedOp));
  // Bytes: one storage of the whole budget displaces everything else.
  ResolvedSpans budget;
  budget.reserve(SpanRecycler::kMaxKeptBytes / sizeof(ResolvedOp));
  const size_t budget_bytes = budget.capacity() * sizeof(ResolvedOp);
  recycler.give(std::move(budget));
  EXPECT_EQ(recycler.kept_bytes(), budget_bytes);
  // Larger than the budget: never kept.
  ResolvedSpans huge;
  huge.reserve(SpanRecycler::kMaxKeptBytes / sizeof(ResolvedOp) + 1);
  recycler.give(std::move(huge));
  EXPECT_EQ(recycler.kept_bytes(), budget_bytes);
}

}  // namespace
}  // namespace kvferry::detail
