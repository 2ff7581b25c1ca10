// Head and state slices against the tables (sglang's send_kvcache_slice).
#include "kvferry/kv/tp_slice.h"

#include <gtest/gtest.h>

namespace kvferry::kv {
namespace {

// The decode rank a prefill rank feeds when P > D (gather): rank / (P / D).
uint32_t decode_rank_fed_by(uint32_t prefill_rank, uint32_t p, uint32_t d) {
  return prefill_rank / (p / d);
}

TEST(HeadSlice, GatherFourPrefillRanksIntoTwoDecodeRanks) {
  const uint32_t expected_dst_start[] = {0, 2, 0, 2};
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<HeadSlice> slice =
        compute_head_slice(TpPair{.prefill_tp_size = 4,
                                  .prefill_tp_rank = rank,
                                  .decode_tp_size = 2,
                                  .decode_tp_rank = decode_rank_fed_by(rank, 4, 2)},
                           8);
    ASSERT_TRUE(slice.ok()) << slice.status().to_string();
    EXPECT_EQ(slice->src_head_start, 0u) << rank;
    EXPECT_EQ(slice->num_heads, 2u) << rank;
    EXPECT_EQ(slice->dst_head_start, expected_dst_start[rank]) << rank;
  }
}

TEST(HeadSlice, ScatterTwoPrefillRanksOverFourDecodeRanks) {
  const uint32_t expected_src_start[] = {0, 2, 0, 2};
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<HeadSlice> slice = compute_head_slice(TpPair{.prefill_tp_size = 2,
                                                        .prefill_tp_rank = rank / 2,
                                                        .decode_tp_size = 4,
                                                        .decode_tp_rank = rank},
                                                 8);
    ASSERT_TRUE(slice.ok()) << slice.status().to_string();
    EXPECT_EQ(slice->src_head_start, expected_src_start[rank]) << rank;
    EXPECT_EQ(slice->num_heads, 2u) << rank;
    EXPECT_EQ(slice->dst_head_start, 0u) << rank;
  }
}

TEST(HeadSlice, GqaReplicationSharesHeadsByIntegerDivision) {
  // P=1 -> D=4 with 2 KV heads: decode ranks 0,1 take head 0 and ranks 2,3 take head 1.
  const uint32_t expected_src_start[] = {0, 0, 1, 1};
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<HeadSlice> slice = compute_head_slice(TpPair{.prefill_tp_size = 1,
                                                        .prefill_tp_rank = 0,
                                                        .decode_tp_size = 4,
                                                        .decode_tp_rank = rank},
                                                 2);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(slice->src_head_start, expected_src_start[rank]) << rank;
    EXPECT_EQ(slice->num_heads, 1u) << rank;
    EXPECT_EQ(slice->dst_head_start, 0u);
  }
}

TEST(HeadSlice, EqualTpSendsEveryHeadInPlace) {
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<HeadSlice> slice = compute_head_slice(TpPair{4, rank, 4, rank}, 8);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(*slice, (HeadSlice{.src_head_start = 0,
                                 .num_heads = 2,
                                 .dst_head_start = 0,
                                 .src_heads_per_rank = 2,
                                 .dst_heads_per_rank = 2}));
  }
}

TEST(HeadSlice, GatherWithReplicatedPrefillHeads) {
  // P=8 -> D=2, 4 heads: prefill ranks pair up on one head each; decode holds 2 heads.
  const uint32_t expected_dst_start[] = {0, 0, 1, 1, 0, 0, 1, 1};
  for (uint32_t rank = 0; rank < 8; ++rank) {
    Result<HeadSlice> slice = compute_head_slice(TpPair{8, rank, 2, rank / 4}, 4);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(slice->num_heads, 1u);
    EXPECT_EQ(slice->dst_head_start, expected_dst_start[rank]) << rank;
  }
}

TEST(RankMapping, DecodeRanksReadTheRightPrefillRanks) {
  EXPECT_EQ(*prefill_ranks_for_decode_rank(4, 4, 3), (std::vector<uint32_t>{3}));
  EXPECT_EQ(*prefill_ranks_for_decode_rank(2, 4, 3), (std::vector<uint32_t>{1}));
  EXPECT_EQ(*prefill_ranks_for_decode_rank(4, 2, 1), (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(*prefill_ranks_for_decode_rank(8, 1, 0),
            (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST(RankMapping, UnpairedRanksAreInvalidArgument) {
  Result<HeadSlice> slice = compute_head_slice(TpPair{4, 3, 2, 0}, 8);
  ASSERT_FALSE(slice.ok());
  EXPECT_EQ(slice.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(slice.status().message().find("not prefill rank 3"), std::string::npos)
      << slice.status().message();
}

TEST(RankMapping, BadSizesAndRanksAreInvalidArgumentNamingThem) {
  EXPECT_NE(validate_tp_pair(TpPair{3, 0, 2, 0}).message().find("multiple"), std::string::npos);
  EXPECT_NE(validate_tp_pair(TpPair{2, 2, 2, 0}).message().find("prefill_tp_rank 2"),
            std::string::npos);
  EXPECT_NE(validate_tp_pair(TpPair{2, 0, 4, 7}).message().find("decode_tp_rank 7"),
            std::string::npos);
  EXPECT_EQ(validate_tp_pair(TpPair{0, 0, 1, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_NE(compute_head_slice(TpPair{}, 0).status().message().find("total_kv_heads"),
            std::string::npos);
}

TEST(StateDimSlice, GatherPlacesEachWriterAfterTheLast) {
  // P=4 -> D=2: prefill ranks hold 8 dims, decode ranks 16.
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<DimSlice> slice = compute_state_dim_slice(TpPair{4, rank, 2, rank / 2}, 8, 16);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(*slice, (DimSlice{0, 8, (rank % 2) * 8u})) << rank;
  }
}

TEST(StateDimSlice, ScatterTakesEachDecodeRanksShare) {
  for (uint32_t rank = 0; rank < 4; ++rank) {
    Result<DimSlice> slice = compute_state_dim_slice(TpPair{2, rank / 2, 4, rank}, 16, 8);
    ASSERT_TRUE(slice.ok());
    EXPECT_EQ(*slice, (DimSlice{(rank % 2) * 8u, 8, 0})) << rank;
  }
}

}  // namespace
}  // namespace kvferry::kv
