#include <gtest/gtest.h>

#include "kvferry/kv/planner.h"
#include "plan_test_util.h"

namespace kvferry::kv {
namespace {

using testing::Block;
using testing::blocks_of;

MhaShape shape(uint32_t kv_heads, uint32_t head_dim) {
  return MhaShape{.num_layers = 1,
                  .page_size_tokens = 2,
                  .kv_heads = kv_heads,
                  .k_head_dim = head_dim,
                  .v_head_dim = head_dim,
                  .dtype_bytes = 1,
                  .num_pages = 4};
}

TEST(HeadSlicedPlan, ScatterSendsOneBlockPerTokenPerEntryWithTheHeadSlice) {
  // P=1 -> D=2, 4 heads of 8 bytes: decode rank 1 takes heads 2..3 of every token.
  KvLayout src = *KvLayout::mha(shape(4, 8), 0);
  KvLayout dst = *KvLayout::mha(shape(2, 8), 100000);
  std::vector<PageIndex> src_pages{1}, dst_pages{3};
  Result<TransferPlan> plan = build_head_sliced_plan(src, dst, src_pages, dst_pages,
                                                     TpPair{1, 0, 2, 1}, 4, {.coalesce = false});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->num_calls(), 1u);
  const uint64_t src_item = 2 * 4 * 8, dst_item = 2 * 2 * 8;  // per page
  const uint64_t v_src = 4 * src_item, v_dst = 100000 + 4 * dst_item;
  EXPECT_EQ(blocks_of(*plan, 0),
            (std::vector<Block>{{src_item + 16, 100000 + 3 * dst_item, 16},
                                {src_item + 32 + 16, 100000 + 3 * dst_item + 16, 16},
                                {v_src + src_item + 16, v_dst + 3 * dst_item, 16},
                                {v_src + src_item + 32 + 16, v_dst + 3 * dst_item + 16, 16}}));
}

TEST(HeadSlicedPlan, EqualTpCoalescesTokensBackIntoRuns) {
  KvLayout src = *KvLayout::mha(shape(2, 8), 0);
  KvLayout dst = *KvLayout::mha(shape(2, 8), 100000);
  std::vector<PageIndex> src_pages{0, 1}, dst_pages{2, 3};
  Result<TransferPlan> plan =
      build_head_sliced_plan(src, dst, src_pages, dst_pages, TpPair{2, 1, 2, 1}, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->num_blocks(), 2u);  // one per entry
}

TEST(HeadSlicedPlan, SliceLargerThanTheDestinationTokenSlotIsAnError) {
  // The decode side registered 4-byte heads where the prefill side sends 8-byte heads.
  KvLayout src = *KvLayout::mha(shape(2, 8), 0);
  KvLayout dst = *KvLayout::mha(shape(2, 4), 100000);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_head_sliced_plan(src, dst, pages, pages, TpPair{}, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("16 bytes"), std::string::npos) << plan.status().message();
  EXPECT_NE(plan.status().message().find("token slot of 8 bytes"), std::string::npos);
}

TEST(HeadSlicedPlan, MlaEntriesAreRejectedBecauseMlaIsReplicated) {
  MlaShape mla{.num_layers = 2, .page_size_tokens = 2, .bytes_per_token = 16, .num_pages = 4};
  KvLayout src = *KvLayout::mla(mla, 0);
  KvLayout dst = *KvLayout::mla(mla, 100000);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_head_sliced_plan(src, dst, pages, pages, TpPair{1, 0, 2, 0}, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("role latent"), std::string::npos);
}

TEST(HeadSlicedPlan, LayoutHeadCountThatDisagreesWithTheTpSplitIsRejected) {
  KvLayout src = *KvLayout::mha(shape(4, 8), 0);  // P=2 of 4 heads holds 2, not 4
  KvLayout dst = *KvLayout::mha(shape(1, 8), 100000);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_head_sliced_plan(src, dst, pages, pages, TpPair{2, 0, 4, 0}, 4);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("holds 4 KV heads"), std::string::npos)
      << plan.status().message();
}

TEST(HeadSlicedPlan, DifferentPageSizesAreRejected) {
  KvLayout src = *KvLayout::mha(shape(2, 8), 0);
  MhaShape other = shape(2, 8);
  other.page_size_tokens = 4;
  KvLayout dst = *KvLayout::mha(other, 100000);
  std::vector<PageIndex> pages{0};
  Result<TransferPlan> plan = build_head_sliced_plan(src, dst, pages, pages, TpPair{}, 2);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("page sizes differ"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::kv
