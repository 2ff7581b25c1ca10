#include "kvferry/kv/slot_plan.h"

#include <gtest/gtest.h>

#include "plan_test_util.h"

namespace kvferry::kv {
namespace {

using testing::Block;
using testing::blocks_of;

TEST(AuxPlan, OneBlockPerAuxBufferFromRowToRow) {
  const RowBuffer src[] = {{1000, 640, 64}, {5000, 1600, 160}};
  const RowBuffer dst[] = {{9000, 640, 64}, {20000, 1600, 160}};
  Result<TransferPlan> plan = build_aux_plan(src, dst, 3, 7);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  ASSERT_EQ(plan->num_calls(), 1u);
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{1000 + 3 * 64, 9000 + 7 * 64, 64},
                                                     {5000 + 3 * 160, 20000 + 7 * 160, 160}}));
}

TEST(AuxPlan, RowBeyondTheBufferIsOutOfRangeNamingIt) {
  const RowBuffer src[] = {{1000, 640, 64}};
  const RowBuffer dst[] = {{9000, 640, 64}};
  Result<TransferPlan> plan = build_aux_plan(src, dst, 0, 10);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(plan.status().message().find("row 10"), std::string::npos) << plan.status().message();
}

TEST(AuxPlan, MismatchedCountsAndRowSizesAreInvalidArgument) {
  const RowBuffer one[] = {{1000, 640, 64}};
  const RowBuffer two[] = {{1000, 640, 64}, {2000, 640, 64}};
  EXPECT_EQ(build_aux_plan(one, two, 0, 0).status().code(), StatusCode::kInvalidArgument);
  const RowBuffer wider[] = {{1000, 1280, 128}};
  Result<TransferPlan> plan = build_aux_plan(one, wider, 0, 0);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("128"), std::string::npos);
}

TEST(MambaStatePlan, EqualTpCopiesWholeSlots) {
  const MambaStateTensor src[] = {{{1000, 4000, 400}, 8}, {{10000, 8000, 800}, 4}};
  const MambaStateTensor dst[] = {{{50000, 4000, 400}, 8}, {{60000, 8000, 800}, 4}};
  Result<TransferPlan> plan = build_mamba_state_plan(src, dst, 2, 5, TpPair{2, 1, 2, 1});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{1000 + 800, 50000 + 2000, 400},
                                                     {10000 + 1600, 60000 + 4000, 800}}));
}

TEST(MambaStatePlan, ScatterTakesTheDecodeRanksDimensions) {
  // P=1 -> D=2: prefill slot of 8 dims x 10 bytes; decode rank 1 holds dims 4..7.
  const MambaStateTensor src[] = {{{1000, 800, 80}, 8}};
  const MambaStateTensor dst[] = {{{9000, 400, 40}, 4}};
  Result<TransferPlan> plan = build_mamba_state_plan(src, dst, 1, 2, TpPair{1, 0, 2, 1});
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{1000 + 80 + 40, 9000 + 80, 40}}));
}

TEST(MambaStatePlan, GatherPlacesEachPrefillRanksDimensions) {
  // P=2 -> D=1: prefill rank 1's 4 dims land at dims 4..7 of the decode slot.
  const MambaStateTensor src[] = {{{1000, 400, 40}, 4}};
  const MambaStateTensor dst[] = {{{9000, 800, 80}, 8}};
  Result<TransferPlan> plan = build_mamba_state_plan(src, dst, 0, 3, TpPair{2, 1, 1, 0});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(blocks_of(*plan, 0), (std::vector<Block>{{1000, 9000 + 240 + 40, 40}}));
}

TEST(MambaStatePlan, SliceThatDoesNotFitTheDestinationIsAnError) {
  // Decode registered 5-byte dims where prefill has 10-byte dims.
  const MambaStateTensor src[] = {{{1000, 800, 80}, 8}};
  const MambaStateTensor dst[] = {{{9000, 200, 20}, 4}};
  Result<TransferPlan> plan = build_mamba_state_plan(src, dst, 0, 0, TpPair{1, 0, 2, 0});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find("state tensor 0"), std::string::npos);
}

TEST(MambaStatePlan, EqualTpWithDifferentSlotSizesIsAnError) {
  const MambaStateTensor src[] = {{{1000, 800, 80}, 8}};
  const MambaStateTensor dst[] = {{{9000, 800, 40}, 8}};
  Result<TransferPlan> plan = build_mamba_state_plan(src, dst, 0, 0, TpPair{});
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("slot sizes differ"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::kv
