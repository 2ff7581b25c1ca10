// The planner against sglang's vectors and its bad-input errors.
#include "kvferry/kv/planner.h"

#include <gtest/gtest.h>

#include <vector>

#include "plan_test_util.h"

namespace kvferry::kv {
namespace {

using testing::Block;
using testing::blocks_of;
using testing::call_field;

// Raw entries as sglang registers them: entry i at ptrs[i], item_lens[i] bytes per page.
KvLayout raw_layout(const std::vector<uint64_t>& ptrs, const std::vector<uint64_t>& item_lens,
                    uint64_t num_pages) {
  std::vector<KvEntry> entries;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    entries.push_back(contiguous_entry(ptrs[i], item_lens[i], num_pages, KvRole::kOpaque,
                                       static_cast<uint32_t>(i)));
  }
  Result<KvLayout> layout = KvLayout::create(KvLayoutInfo{}, std::move(entries));
  EXPECT_TRUE(layout.ok()) << layout.status().to_string();
  return *layout;
}

// 43 entries, src 100000 + 10000 i, dst 200000 + 10000 i, item 100.
struct FortyThreeEntries {
  FortyThreeEntries() {
    std::vector<uint64_t> src_ptrs, dst_ptrs, items;
    for (uint64_t i = 0; i < 43; ++i) {
      src_ptrs.push_back(100000 + 10000 * i);
      dst_ptrs.push_back(200000 + 10000 * i);
      items.push_back(100);
    }
    src = raw_layout(src_ptrs, items, 16);
    dst = raw_layout(dst_ptrs, items, 16);
  }
  KvLayout src, dst;
  std::vector<PageIndex> src_pages{1, 2, 5};
  std::vector<PageIndex> dst_pages{11, 12, 15};
};

TEST(AllLayersPlan, FortyThreeEntriesGiveOneCallOfEightySixBlocks) {
  FortyThreeEntries f;
  Result<TransferPlan> plan =
      build_transfer_plan(f.src, f.dst, f.src_pages, f.dst_pages,
                          PlanOptions{.strategy = SendStrategy::kAllLayers, .coalesce = false});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->num_calls(), 1u);
  const std::vector<Block> blocks = blocks_of(*plan, 0);
  ASSERT_EQ(blocks.size(), 86u);
  EXPECT_EQ(blocks[0], Block(100100, 201100, 200));
  EXPECT_EQ(blocks[1], Block(100500, 201500, 100));
  EXPECT_EQ(blocks[84], Block(520100, 621100, 200));
  EXPECT_EQ(blocks[85], Block(520500, 621500, 100));
  EXPECT_EQ(plan->total_bytes(), 43u * 300);
}

TEST(AllLayersPlan, CoalescingLeavesNonContiguousEntriesApart) {
  FortyThreeEntries f;
  Result<TransferPlan> plan = build_transfer_plan(f.src, f.dst, f.src_pages, f.dst_pages);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks(), 86u);
}

// Two entries (1000, 2000) -> (5000, 6000), items (10, 20), pages [0..4] -> [10..14].
struct TwoEntries {
  KvLayout src = raw_layout({1000, 2000}, {10, 20}, 15);
  KvLayout dst = raw_layout({5000, 6000}, {10, 20}, 15);
  std::vector<PageIndex> src_pages{0, 1, 2, 3, 4};
  std::vector<PageIndex> dst_pages{10, 11, 12, 13, 14};

  Result<TransferPlan> plan(SendStrategy strategy, uint32_t max_pages = 0) const {
    return build_transfer_plan(
        src, dst, src_pages, dst_pages,
        PlanOptions{.strategy = strategy, .max_pages_per_call = max_pages, .coalesce = false});
  }
};

TEST(IndexShardedPlan, LimitOfTwoCutsFivePagesIntoThreeCalls) {
  Result<TransferPlan> plan = TwoEntries{}.plan(SendStrategy::kIndexSharded, 2);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->num_calls(), 3u);
  using V = std::vector<uint64_t>;
  const V expected_src[] = {{1000, 2000}, {1020, 2040}, {1040, 2080}};
  const V expected_dst[] = {{5100, 6200}, {5120, 6240}, {5140, 6280}};
  const V expected_len[] = {{20, 40}, {20, 40}, {10, 20}};
  for (size_t c = 0; c < 3; ++c) {
    EXPECT_EQ(call_field(plan->call(c).src), expected_src[c]) << "call " << c;
    EXPECT_EQ(call_field(plan->call(c).dst), expected_dst[c]) << "call " << c;
    EXPECT_EQ(call_field(plan->call(c).len), expected_len[c]) << "call " << c;
  }
}

TEST(IndexShardedPlan, NoLimitOrALimitAtLeastThePageCountGivesOneCall) {
  for (uint32_t limit : {0u, 5u, 6u}) {
    Result<TransferPlan> plan = TwoEntries{}.plan(SendStrategy::kIndexSharded, limit);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_EQ(plan->num_calls(), 1u) << "limit " << limit;
    EXPECT_EQ(call_field(plan->call(0).src), (std::vector<uint64_t>{1000, 2000}));
    EXPECT_EQ(call_field(plan->call(0).dst), (std::vector<uint64_t>{5100, 6200}));
    EXPECT_EQ(call_field(plan->call(0).len), (std::vector<uint64_t>{50, 100})) << "limit " << limit;
  }
}

TEST(IndexShardedPlan, ABlockNeverCrossesASliceEvenWhenTheRunDoes) {
  // One run of five pages; with limit 2 it must still be cut at pages 2 and 4.
  Result<TransferPlan> plan = TwoEntries{}.plan(SendStrategy::kIndexSharded, 2);
  ASSERT_TRUE(plan.ok());
  for (size_t c = 0; c < plan->num_calls(); ++c) {
    EXPECT_LE(plan->call(c).len[0], 2u * 10) << "call " << c;
  }
}

TEST(PerLayerPlan, OneCallPerEntryInEntryOrder) {
  Result<TransferPlan> plan = TwoEntries{}.plan(SendStrategy::kPerLayer);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->num_calls(), 2u);
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{1000, 5100, 50}}));
  EXPECT_EQ(blocks_of(*plan, 1), (std::vector<Block>{{2000, 6200, 100}}));
  EXPECT_EQ(plan->strategy(), SendStrategy::kPerLayer);
}

TEST(AllLayersPlan, EmptyPageListsGiveAnEmptyPlan) {
  TwoEntries f;
  for (SendStrategy s : kAllSendStrategies) {
    Result<TransferPlan> plan = build_transfer_plan(f.src, f.dst, {}, {}, {.strategy = s});
    ASSERT_TRUE(plan.ok());
    EXPECT_EQ(plan->num_calls(), 0u);
    EXPECT_EQ(plan->num_blocks(), 0u);
  }
}

TEST(Coalescing, MergesEntriesThatAreBackToBackOnBothSides) {
  // Entry 1 starts where entry 0's page 4 ends, on both sides: page 4 of entry 0 and page 0
  // of entry 1 are one contiguous range.
  KvLayout src = raw_layout({0, 50}, {10, 10}, 5);
  KvLayout dst = raw_layout({1000, 1050}, {10, 10}, 5);
  std::vector<PageIndex> pages{0, 1, 2, 3, 4};
  Result<TransferPlan> plan = build_transfer_plan(src, dst, pages, pages);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{0, 1000, 100}}));
}

TEST(Coalescing, PageMajorPoolGivesOneBlockPerRunForAllLayers) {
  MhaShape shape{.num_layers = 4,
                 .page_size_tokens = 2,
                 .kv_heads = 2,
                 .k_head_dim = 4,
                 .v_head_dim = 2,
                 .dtype_bytes = 2,
                 .num_pages = 32};
  Result<KvLayout> src = KvLayout::mha(shape, 1 << 20, PageOrder::kPageMajor);
  Result<KvLayout> dst = KvLayout::mha(shape, 1 << 24, PageOrder::kPageMajor);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<PageIndex> src_pages{3, 4, 5, 9, 20, 21};
  std::vector<PageIndex> dst_pages{7, 8, 9, 1, 2, 3};
  Result<TransferPlan> plan = build_transfer_plan(*src, *dst, src_pages, dst_pages);
  ASSERT_TRUE(plan.ok());
  const uint64_t page_bytes = 4 * 2 * 2 * (4 + 2) * 2;
  EXPECT_EQ(blocks_of(*plan, 0),
            (std::vector<Block>{
                {(1 << 20) + 3 * page_bytes, (1 << 24) + 7 * page_bytes, 3 * page_bytes},
                {(1 << 20) + 9 * page_bytes, (1 << 24) + 1 * page_bytes, page_bytes},
                {(1 << 20) + 20 * page_bytes, (1 << 24) + 2 * page_bytes, 2 * page_bytes}}));
  Result<TransferPlan> uncoalesced =
      build_transfer_plan(*src, *dst, src_pages, dst_pages, {.coalesce = false});
  ASSERT_TRUE(uncoalesced.ok());
  EXPECT_EQ(uncoalesced->num_blocks(), 6u * 8);  // one per page per entry
}

TEST(TransferPlanMemory, ReportsAtMostThirtyTwoBytesPerBlockForLargePlans) {
  MlaShape shape{
      .num_layers = 61, .page_size_tokens = 64, .bytes_per_token = 1152, .num_pages = 4096};
  Result<KvLayout> src = KvLayout::mla(shape, 0);
  Result<KvLayout> dst = KvLayout::mla(shape, 1ull << 40);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<PageIndex> src_pages, dst_pages;
  for (PageIndex p = 0; p < 2048; ++p) {
    src_pages.push_back(2 * p);  // every page its own run
    dst_pages.push_back(4095 - 2 * p);
  }
  Result<TransferPlan> plan = build_transfer_plan(*src, *dst, src_pages, dst_pages);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks(), 2048u * 61);
  EXPECT_LE(plan->memory_bytes(), 32 * plan->num_blocks());
}

// --- Bad input: typed errors that name the value.

TEST(PlannerBadInput, UnequalPageListsAreInvalidArgumentNamingBothLengths) {
  TwoEntries f;
  std::vector<PageIndex> three{0, 1, 2}, two{10, 11};
  Result<TransferPlan> plan = build_transfer_plan(f.src, f.dst, three, two);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("3 pages"), std::string::npos) << plan.status().message();
  EXPECT_NE(plan.status().message().find("has 2"), std::string::npos) << plan.status().message();
}

TEST(PlannerBadInput, PageBeyondTheEntryBytesIsOutOfRangeNamingThePage) {
  TwoEntries f;  // 15 pages per entry
  std::vector<PageIndex> src{0, 1}, dst{10, 15};
  Result<TransferPlan> plan = build_transfer_plan(f.src, f.dst, src, dst);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(plan.status().message().find("dst page 15"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("15 pages"), std::string::npos);
}

TEST(PlannerBadInput, ZeroItemLenIsRejectedWhenTheLayoutIsBuilt) {
  Result<KvLayout> layout = KvLayout::create(
      KvLayoutInfo{}, {contiguous_entry(1000, 10, 4), contiguous_entry(2000, 0, 4)});
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(layout.status().message().find("entry 1"), std::string::npos);
  EXPECT_NE(layout.status().message().find("item_len 0"), std::string::npos);
}

TEST(PlannerBadInput, MismatchedEntryCountsAreInvalidArgumentNamingBoth) {
  KvLayout src = raw_layout({1000, 2000, 3000}, {10, 10, 10}, 4);
  KvLayout dst = raw_layout({5000, 6000}, {10, 10}, 4);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_transfer_plan(src, dst, pages, pages);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("3 entries"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("has 2"), std::string::npos);
}

TEST(PlannerBadInput, DifferentItemLengthsPerEntryAreRejected) {
  KvLayout src = raw_layout({1000, 2000}, {10, 20}, 4);
  KvLayout dst = raw_layout({5000, 6000}, {10, 30}, 4);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_transfer_plan(src, dst, pages, pages);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("entry 1"), std::string::npos);
  EXPECT_NE(plan.status().message().find("30"), std::string::npos);
}

TEST(PlannerBadInput, PageLimitWithoutIndexShardingIsRejectedNotIgnored) {
  TwoEntries f;
  Result<TransferPlan> plan = f.plan(SendStrategy::kAllLayers, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("max_pages_per_call 2"), std::string::npos);
  EXPECT_NE(plan.status().message().find("all_layers"), std::string::npos);
}

TEST(PlannerBadInput, MismatchedRolesAreRejected) {
  MhaShape shape{.num_layers = 2,
                 .page_size_tokens = 1,
                 .kv_heads = 1,
                 .k_head_dim = 8,
                 .v_head_dim = 8,
                 .dtype_bytes = 2,
                 .num_pages = 4};
  MlaShape mla{.num_layers = 4, .page_size_tokens = 1, .bytes_per_token = 16, .num_pages = 4};
  Result<KvLayout> src = KvLayout::mha(shape, 0);
  Result<KvLayout> dst = KvLayout::mla(mla, 4096);
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_transfer_plan(*src, *dst, pages, pages);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("role K"), std::string::npos) << plan.status().message();
}

}  // namespace
}  // namespace kvferry::kv
