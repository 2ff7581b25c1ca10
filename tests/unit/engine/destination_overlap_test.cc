// check_disjoint_destinations against a brute-force comparison of every pair, on random
// batches in both orders (ascending: the one-pass path; shuffled: the radix sort).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
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
    }
    bool expected = false;
    for (size_t i = 0; i < n && !expected; ++i) {
      for (size_t j = i + 1; j < n && !expected; ++j) expected = overlap(ops[i], ops[j], one_space);
    }
    Status s = check_disjoint_destinations(ops, one_space);
    ASSERT_EQ(!s.ok(), expected) << "trial " << trial << ": " << s.to_string();
    if (!expected) continue;
    ++overlapping_batches;
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    // The two ops it names do overlap.
    size_t a = 0, b = 0;
    ASSERT_EQ(std::sscanf(s.message().c_str(), "ops %zu and %zu", &a, &b), 2) << s.message();
    ASSERT_LT(b, n);
    EXPECT_TRUE(overlap(ops[a], ops[b], one_space)) << s.message();
  }
  EXPECT_GT(overlapping_batches, 50);  // both verdicts were exercised
  EXPECT_LT(overlapping_batches, 350);
}

}  // namespace
}  // namespace kvferry
