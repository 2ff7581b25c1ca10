#include "kvferry/kv/kv_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvferry::kv {
namespace {

MhaShape llama_like() {
  return MhaShape{.num_layers = 3,
                  .page_size_tokens = 4,
                  .kv_heads = 2,
                  .k_head_dim = 8,
                  .v_head_dim = 4,
                  .dtype_bytes = 2,
                  .num_pages = 10};
}

TEST(MhaLayout, AllKeyEntriesThenAllValueEntriesWithTheirOwnItemLengths) {
  Result<KvLayout> layout = KvLayout::mha(llama_like(), 4096);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  ASSERT_EQ(layout->num_entries(), 6u);
  const uint64_t k_item = 4 * 2 * 8 * 2, v_item = 4 * 2 * 4 * 2;
  uint64_t expected_base = 4096;
  for (size_t i = 0; i < 6; ++i) {
    const KvEntry& e = layout->entry(i);
    EXPECT_EQ(e.role, i < 3 ? KvRole::kKey : KvRole::kValue) << i;
    EXPECT_EQ(e.layer_id, i % 3) << i;
    EXPECT_EQ(e.item_len, i < 3 ? k_item : v_item) << i;
    EXPECT_EQ(e.page_stride, e.item_len);
    EXPECT_EQ(e.base, expected_base) << i;
    EXPECT_EQ(e.num_pages(), 10u);
    expected_base += e.item_len * 10;
  }
  EXPECT_EQ(layout->info().kv_heads, 2u);
  EXPECT_EQ(layout->num_pages(), 10u);
  EXPECT_EQ(*KvLayout::region_bytes(llama_like()), expected_base - 4096);
}

TEST(MhaLayout, PageMajorPutsEveryLayerOfAPageTogether) {
  Result<KvLayout> layout = KvLayout::mha(llama_like(), 0, PageOrder::kPageMajor);
  ASSERT_TRUE(layout.ok());
  const uint64_t k_item = 128, v_item = 64, page = 3 * (k_item + v_item);
  for (size_t i = 0; i < 6; ++i) {
    const KvEntry& e = layout->entry(i);
    EXPECT_EQ(e.page_stride, page);
    EXPECT_EQ(e.base, i < 3 ? i * k_item : 3 * k_item + (i - 3) * v_item) << i;
    EXPECT_EQ(e.num_pages(), 10u) << i;
    EXPECT_LE(e.base + e.bytes, 10 * page);
  }
  EXPECT_EQ(layout->info().page_order, PageOrder::kPageMajor);
}

TEST(MlaLayout, OneLatentEntryPerLayer) {
  MlaShape shape{.num_layers = 61, .page_size_tokens = 64, .bytes_per_token = 1152, .num_pages = 8};
  Result<KvLayout> layout = KvLayout::mla(shape, 0);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->num_entries(), 61u);
  for (size_t i = 0; i < 61; ++i) {
    EXPECT_EQ(layout->entry(i).role, KvRole::kLatent);
    EXPECT_EQ(layout->entry(i).item_len, 64u * 1152);
    EXPECT_EQ(layout->entry(i).layer_id, i);
  }
}

TEST(DraftLayout, DraftEntriesFollowTheTargetsAndAreMarked) {
  Result<KvLayout> target = KvLayout::mha(llama_like(), 0);
  MhaShape draft_shape = llama_like();
  draft_shape.num_layers = 1;
  Result<KvLayout> draft = KvLayout::mha(draft_shape, 1 << 20);
  ASSERT_TRUE(target.ok() && draft.ok());
  Result<KvLayout> both = target->with_draft(*draft);
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both->num_entries(), 8u);
  for (size_t i = 0; i < 6; ++i) EXPECT_FALSE(both->entry(i).draft);
  EXPECT_TRUE(both->entry(6).draft);
  EXPECT_EQ(both->entry(6).role, KvRole::kKey);
  EXPECT_EQ(both->entry(7).role, KvRole::kValue);
  EXPECT_EQ(both->entry(6).base, uint64_t{1} << 20);
}

TEST(DraftLayout, DifferentPageSizeIsRejected) {
  Result<KvLayout> target = KvLayout::mha(llama_like(), 0);
  MhaShape other = llama_like();
  other.page_size_tokens = 16;
  Result<KvLayout> draft = KvLayout::mha(other, 1 << 20);
  Result<KvLayout> both = target->with_draft(*draft);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("16"), std::string::npos);
}

TEST(KvLayoutValidation, RejectsEachBadEntryNamingIt) {
  struct Case {
    KvEntry entry;
    const char* expected;
  };
  const Case cases[] = {
      {KvEntry{.base = 0, .bytes = 100, .item_len = 0, .page_stride = 10}, "item_len 0"},
      {KvEntry{.base = 0, .bytes = 100, .item_len = 10, .page_stride = 5}, "page_stride 5"},
      {KvEntry{.base = 0, .bytes = 4, .item_len = 10, .page_stride = 10}, "bytes 4"},
      {KvEntry{.base = ~uint64_t{0} - 5, .bytes = 10, .item_len = 10, .page_stride = 10},
       "address space"},
  };
  for (const Case& c : cases) {
    Result<KvLayout> layout =
        KvLayout::create(KvLayoutInfo{}, {contiguous_entry(0, 10, 1), c.entry});
    ASSERT_FALSE(layout.ok()) << c.expected;
    EXPECT_EQ(layout.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(layout.status().message().find("entry 1"), std::string::npos)
        << layout.status().message();
    EXPECT_NE(layout.status().message().find(c.expected), std::string::npos)
        << layout.status().message();
  }
}

TEST(KvLayoutValidation, RejectsNoEntriesAndZeroShapes) {
  EXPECT_EQ(KvLayout::create(KvLayoutInfo{}, {}).status().code(), StatusCode::kInvalidArgument);
  MhaShape shape = llama_like();
  shape.kv_heads = 0;
  Result<KvLayout> layout = KvLayout::mha(shape, 0);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("kv_heads"), std::string::npos);
  MlaShape mla{.num_layers = 2, .page_size_tokens = 0, .bytes_per_token = 8, .num_pages = 1};
  EXPECT_NE(KvLayout::mla(mla, 0).status().message().find("page_size_tokens"), std::string::npos);
}

TEST(KvLayoutValidation, RegionThatOverflowsIsRejected) {
  MlaShape shape{.num_layers = 1000,
                 .page_size_tokens = 1 << 20,
                 .bytes_per_token = 1 << 20,
                 .num_pages = 1 << 30};
  Result<KvLayout> layout = KvLayout::mla(shape, 0);
  ASSERT_FALSE(layout.ok());
  EXPECT_NE(layout.status().message().find("overflows"), std::string::npos);
}

// A wrong count (a negative number read as unsigned, bytes passed as pages) must be an error
// naming it, not an allocation of its size: mla(2^31 layers) would be 16 GiB of entries.
TEST(KvLayoutValidation, CountsAndSizesPastTheirLimitsAreRefusedNamingTheValue) {
  struct Case {
    Result<KvLayout> layout;
    std::string expected;
  };
  MlaShape mla{.num_layers = 61, .page_size_tokens = 64, .bytes_per_token = 1152, .num_pages = 8};
  MhaShape mha = llama_like();
  std::vector<Case> cases;
  MlaShape s = mla;
  s.num_layers = 1u << 31;
  cases.push_back({KvLayout::mla(s, 0), "num_layers 2147483648 out of range 1..65536"});
  s = mla;
  s.num_pages = uint64_t{1} << 33;
  cases.push_back({KvLayout::mla(s, 0), "num_pages 8589934592 out of range 1..4294967296"});
  s = mla;
  s.page_size_tokens = (1u << 20) + 1;
  cases.push_back({KvLayout::mla(s, 0), "page_size_tokens 1048577 out of range 1..1048576"});
  s = mla;
  s.page_size_tokens = 1u << 20;
  s.bytes_per_token = 1u << 21;
  cases.push_back({KvLayout::mla(s, 0),
                   "a latent page (page_size_tokens 1048576 x "
                   "bytes_per_token 2097152) exceeds 1099511627776"});
  MhaShape m = mha;
  m.num_layers = 1u << 17;
  cases.push_back({KvLayout::mha(m, 0), "num_layers 131072"});
  m = mha;
  m.kv_heads = 1u << 30;
  m.k_head_dim = 1u << 30;
  m.dtype_bytes = 1u << 30;  // 2^92 bytes per page: an overflow, not a wrapped small number
  cases.push_back({KvLayout::mha(m, 0), "a K page"});
  KvEntry big = contiguous_entry(0, (uint64_t{1} << 40) + 1, 1);
  cases.push_back({KvLayout::create(KvLayoutInfo{}, {big}), "item_len 1099511627777"});
  KvLayoutInfo info;
  info.page_size_tokens = 1u << 21;
  cases.push_back(
      {KvLayout::create(info, {contiguous_entry(0, 64, 1)}), "page_size_tokens 2097152"});
  for (const Case& c : cases) {
    ASSERT_FALSE(c.layout.ok()) << c.expected;
    EXPECT_EQ(c.layout.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(c.layout.status().message().find(c.expected), std::string::npos)
        << c.layout.status().message();
  }
  m = mha;
  m.num_layers = 1u << 31;
  EXPECT_EQ(KvLayout::region_bytes(m).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvLayoutValidation, ShapesAtTheirLimitsStillBuild) {
  MlaShape mla{.num_layers = kMaxLayers,
               .page_size_tokens = 1,
               .bytes_per_token = 64,
               .num_pages = kMaxShapePages};
  Result<KvLayout> layout = KvLayout::mla(mla, 0);
  ASSERT_TRUE(layout.ok()) << layout.status().to_string();
  EXPECT_EQ(layout->num_entries(), kMaxLayers);
  EXPECT_EQ(layout->num_pages(), kMaxShapePages);
  EXPECT_EQ(*KvLayout::region_bytes(mla), uint64_t{kMaxLayers} * 64 * kMaxShapePages);
}

}  // namespace
}  // namespace kvferry::kv
