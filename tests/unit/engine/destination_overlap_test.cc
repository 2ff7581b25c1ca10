// check_disjoint_destinations against a brute-force comparison of every pair, on random
// batches in three orders (ascending and descending: the one-pass paths; shuffled: the radix
// sort), and on batches too large for that against a comparison sort (the radix sort's wide
// digits), and on starts spread over the whole address space (too many differing bits to
// pack with an index).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/op_resolver.h"
#include "test_support.h"

namespace kvferry {
namespace {

uint64_t dst(const TransferOp& op) {
  return op.kind == OpKind::kWrite ? op.remote_addr : op.local_addr;
}

bool overlap(const TransferOp& a, const TransferOp& b, bool one_space) {
  if (!one_space && a.kind != b.kind) return false;
  return dst(a) < dst(b) + b.length && dst(b) < dst(a) + a.length;
}

// check_disjoint_destinations gives `expected`, and a refusal names two ops that overlap.
void expect_verdict(const std::vector<TransferOp>& ops, bool one_space, bool expected) {
  const Status s = check_disjoint_destinations(ops, one_space);
  ASSERT_EQ(!s.ok(), expected) << ops.size() << " ops: " << s.to_string();
  if (!expected) return;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  size_t a = 0, b = 0;
  ASSERT_EQ(std::sscanf(s.message().c_str(), "ops %zu and %zu", &a, &b), 2) << s.message();
  ASSERT_LT(b, ops.size());
  EXPECT_TRUE(overlap(ops[a], ops[b], one_space)) << s.message();
}

// Moves one op onto another of its kind, `into` bytes past that one's start.
void plant_overlap(std::vector<TransferOp>& ops, std::mt19937_64& rng, uint64_t into) {
  const size_t victim = rng() % ops.size();
  size_t mover = rng() % ops.size();
  while (mover == victim || ops[mover].kind != ops[victim].kind) mover = rng() % ops.size();
  ops[mover].local_addr = ops[mover].remote_addr = dst(ops[victim]) + into;
}

TEST(DestinationOverlap, AgreesWithComparingEveryPair) {
  std::mt19937_64 rng(2026);
  int overlapping_batches = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool one_space = trial % 3 == 0;
    // Both sorts: a comparison sort below 128 ops, the radix sort from there.
    const size_t n = 1 + rng() % 400;
    // Sparse or dense: some batches never overlap, some almost always do.
    const uint64_t spread = (trial % 2 == 0 ? 4096 : 64) * n;
    std::vector<TransferOp> ops;
    for (size_t i = 0; i < n; ++i) {
      const OpKind kind = rng() % 2 == 0 ? OpKind::kWrite : OpKind::kRead;
      // Distinct high bytes too, so the radix sort uses more than the low passes.
      const uint64_t base = (uint64_t{1} << 44) + ((rng() % 3) << 36);
      const uint64_t at = base + (rng() % spread) * 8;
      const uint64_t len = 1 + rng() % 64;
      ops.push_back({kind, at, at, len});
    }
    if (trial % 4 == 1) {
      std::sort(ops.begin(), ops.end(),
                [](const TransferOp& a, const TransferOp& b) { return dst(a) < dst(b); });
    } else if (trial % 4 == 3) {
      std::sort(ops.begin(), ops.end(),
                [](const TransferOp& a, const TransferOp& b) { return dst(a) > dst(b); });
    }
    bool expected = false;
    for (size_t i = 0; i < n && !expected; ++i) {
      for (size_t j = i + 1; j < n && !expected; ++j) expected = overlap(ops[i], ops[j], one_space);
    }
    SCOPED_TRACE("trial " + std::to_string(trial));
    ASSERT_NO_FATAL_FAILURE(expect_verdict(ops, one_space, expected));
    if (expected) ++overlapping_batches;
  }
  EXPECT_GT(overlapping_batches, 50);  // both verdicts were exercised
  EXPECT_LT(overlapping_batches, 350);
}

// Whether two destinations overlap, found by sorting each space with std::sort.
bool any_overlap_by_comparison_sort(std::vector<TransferOp> ops, bool one_space) {
  auto space = [&](const TransferOp& op) { return one_space || op.kind == OpKind::kWrite ? 0 : 1; };
  std::sort(ops.begin(), ops.end(), [&](const TransferOp& a, const TransferOp& b) {
    return std::pair(space(a), dst(a)) < std::pair(space(b), dst(b));
  });
  for (size_t i = 1; i < ops.size(); ++i) {
    if (overlap(ops[i - 1], ops[i], one_space)) return true;
  }
  return false;
}

TEST(DestinationOverlap, LargeShuffledBatchesAgreeWithAComparisonSort) {
  std::mt19937_64 rng(7);
  // The buffers stay with this thread between calls: sizes up and down, and both verdicts.
  for (const size_t n : {size_t{70'000}, size_t{300}, size_t{200'000}, size_t{70'000}}) {
    for (const bool plant : {false, true}) {
      // Aligned 64-byte blocks 128 bytes apart, in shuffled order: 17-19 bits differ.
      std::vector<TransferOp> ops;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t at = (uint64_t{1} << 40) + i * 128;
        ops.push_back({i % 5 == 0 ? OpKind::kRead : OpKind::kWrite, at, at, 64});
      }
      std::shuffle(ops.begin(), ops.end(), rng);
      if (plant) plant_overlap(ops, rng, 32);  // onto the second half of another op
      const bool expected = any_overlap_by_comparison_sort(ops, false);
      ASSERT_EQ(expected, plant) << n;
      ASSERT_NO_FATAL_FAILURE(expect_verdict(ops, false, expected));
    }
  }
}

TEST(DestinationOverlap, StartsSpreadOverTheWholeAddressSpaceAgreeWithAComparisonSort) {
  std::mt19937_64 rng(11);
  for (const size_t n : {size_t{5}, size_t{200}, size_t{5'000}}) {
    for (const bool plant : {false, true}) {
      // Random 64-bit starts: about 64 bits differ, more than the index leaves beside them.
      std::vector<TransferOp> ops;
      for (size_t i = 0; i < n; ++i) {
        const uint64_t at = (rng() >> 1) & ~uint64_t{4095};
        ops.push_back({i % 3 == 0 ? OpKind::kRead : OpKind::kWrite, at, at, 4096});
      }
      if (plant) plant_overlap(ops, rng, 100);  // into the middle of another op
      for (const bool one_space : {false, true}) {
        const bool expected = any_overlap_by_comparison_sort(ops, one_space);
        if (!one_space) {
          ASSERT_EQ(expected, plant) << n;
        }
        ASSERT_NO_FATAL_FAILURE(expect_verdict(ops, one_space, expected));
      }
    }
  }
}

}  // namespace
}  // namespace kvferry
