// Property tests: thousands of random layouts, page lists and options, each plan applied to
// real bytes and compared with a deliberately naive page-by-page (and, for head slicing,
// head-by-head) reference. Same bytes must land in the same places for every strategy, with
// and without coalescing.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "kvferry/kv/page_runs.h"
#include "kvferry/kv/planner.h"
#include "plan_test_util.h"

namespace kvferry::kv {
namespace {

using testing::apply_plan;
using testing::HostBuffer;

constexpr int kCases = 3000;

uint32_t uniform(std::mt19937& rng, uint32_t lo, uint32_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
}

// Page lists with runs: mostly steps of one page, up or down (each side's direction drawn
// anew at each jump, so runs both sides walk down, and runs they walk opposite ways, come
// up), sometimes jumps. Destination pages are distinct (two source pages landing on one
// destination page would make the result order-dependent).
void random_pages(std::mt19937& rng, uint32_t src_capacity, uint32_t dst_capacity, size_t n,
                  std::vector<PageIndex>& src, std::vector<PageIndex>& dst) {
  std::vector<bool> used(dst_capacity, false);
  int64_t src_by = 1, dst_by = 1;
  // The page `by` from `from`, if it is one of `capacity`.
  auto next = [](PageIndex from, int64_t by, uint32_t capacity) -> std::optional<PageIndex> {
    const int64_t at = int64_t{from} + by;
    if (at < 0 || at >= int64_t{capacity}) return std::nullopt;
    return static_cast<PageIndex>(at);
  };
  for (size_t i = 0; i < n; ++i) {
    const bool step = i > 0 && uniform(rng, 0, 9) < 7;
    if (!step) {
      src_by = uniform(rng, 0, 1) == 0 ? 1 : -1;
      dst_by = uniform(rng, 0, 1) == 0 ? 1 : -1;
    }
    const std::optional<PageIndex> src_step =
        step ? next(src.back(), src_by, src_capacity) : std::nullopt;
    const std::optional<PageIndex> dst_step =
        step ? next(dst.back(), dst_by, dst_capacity) : std::nullopt;
    PageIndex s = src_step ? *src_step : uniform(rng, 0, src_capacity - 1);
    PageIndex d;
    if (dst_step && !used[*dst_step]) {
      d = *dst_step;
    } else {
      do d = uniform(rng, 0, dst_capacity - 1);
      while (used[d]);
    }
    used[d] = true;
    src.push_back(s);
    dst.push_back(d);
  }
}

// Raw entries of random item lengths placed in `buffer` with random gaps (a zero gap lets
// coalescing merge across entries).
KvLayout raw_layout_in(const std::vector<uint64_t>& item_lens, uint32_t num_pages,
                       const std::vector<uint32_t>& gaps, const HostBuffer& buffer) {
  std::vector<KvEntry> entries;
  uint64_t offset = 0;
  for (size_t e = 0; e < item_lens.size(); ++e) {
    offset += gaps[e];
    entries.push_back(contiguous_entry(buffer.base() + offset, item_lens[e], num_pages,
                                       KvRole::kOpaque, static_cast<uint32_t>(e)));
    offset += item_lens[e] * num_pages;
  }
  return *KvLayout::create(KvLayoutInfo{}, std::move(entries));
}

uint64_t raw_bytes(const std::vector<uint64_t>& item_lens, uint32_t pages,
                   const std::vector<uint32_t>& gaps) {
  uint64_t total = 0;
  for (size_t e = 0; e < item_lens.size(); ++e) total += gaps[e] + item_lens[e] * pages;
  return total;
}

void naive_copy(const KvLayout& src, const KvLayout& dst, std::span<const PageIndex> src_pages,
                std::span<const PageIndex> dst_pages) {
  for (size_t e = 0; e < src.num_entries(); ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    for (size_t i = 0; i < src_pages.size(); ++i) {
      std::memcpy(reinterpret_cast<void*>(d.base + dst_pages[i] * d.page_stride),
                  reinterpret_cast<const void*>(s.base + src_pages[i] * s.page_stride), s.item_len);
    }
  }
}

size_t expected_calls(const PlanOptions& o, size_t pages, size_t entries) {
  if (pages == 0) return 0;
  switch (o.strategy) {
    case SendStrategy::kAllLayers: return 1;
    case SendStrategy::kPerLayer: return entries;
    case SendStrategy::kIndexSharded:
      return o.max_pages_per_call == 0 ? 1
                                       : (pages + o.max_pages_per_call - 1) / o.max_pages_per_call;
  }
  return 0;
}

PlanOptions random_options(std::mt19937& rng, size_t pages) {
  PlanOptions o;
  o.strategy = kAllSendStrategies[uniform(rng, 0, 2)];
  o.coalesce = uniform(rng, 0, 1) == 1;
  if (o.strategy == SendStrategy::kIndexSharded) {
    o.max_pages_per_call = uniform(rng, 0, static_cast<uint32_t>(pages) + 2);
  }
  return o;
}

// Checks the shape of a plan: call count and per-call bytes follow the strategy; coalescing
// left no two mergeable neighbours; memory stays near 24 bytes per block.
void check_structure(const TransferPlan& plan, const PlanOptions& o, const KvLayout& src,
                     size_t pages, uint64_t bytes_per_entry_page_sum) {
  ASSERT_EQ(plan.num_calls(), expected_calls(o, pages, src.num_entries()));
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    const PlanCall call = plan.call(c);
    if (o.strategy == SendStrategy::kPerLayer) {
      EXPECT_EQ(call.bytes(), pages * src.entry(c).item_len) << "call " << c;
    } else if (o.strategy == SendStrategy::kIndexSharded && o.max_pages_per_call > 0) {
      const size_t slice_pages =
          std::min<size_t>(o.max_pages_per_call, pages - c * o.max_pages_per_call);
      EXPECT_EQ(call.bytes(), slice_pages * bytes_per_entry_page_sum) << "call " << c;
    }
    if (o.coalesce) {
      for (size_t b = 1; b < call.num_blocks(); ++b) {
        const bool mergeable = call.src[b - 1] + call.len[b - 1] == call.src[b] &&
                               call.dst[b - 1] + call.len[b - 1] == call.dst[b];
        ASSERT_FALSE(mergeable) << "call " << c << " block " << b;
      }
    }
  }
  EXPECT_LE(plan.memory_bytes(),
            sizeof(TransferPlan) + 30 * plan.num_blocks() + sizeof(size_t) * 2 * plan.num_calls());
}

TEST(PlannerProperty, RawEntriesMatchThePageByPageReference) {
  std::mt19937 rng(20260915);
  for (int iteration = 0; iteration < kCases; ++iteration) {
    SCOPED_TRACE("case " + std::to_string(iteration));
    const size_t entries = uniform(rng, 1, 6);
    std::vector<uint64_t> items(entries);
    std::vector<uint32_t> src_gaps(entries), dst_gaps(entries);
    for (size_t e = 0; e < entries; ++e) {
      items[e] = uniform(rng, 1, 40);
      src_gaps[e] = uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 30);
      dst_gaps[e] = uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 30);
    }
    const uint32_t src_capacity = uniform(rng, 1, 24), dst_capacity = uniform(rng, 1, 24);
    HostBuffer src_mem(raw_bytes(items, src_capacity, src_gaps));
    HostBuffer dst_mem(raw_bytes(items, dst_capacity, dst_gaps));
    src_mem.fill_random(iteration);
    dst_mem.fill_random(~iteration);
    KvLayout src = raw_layout_in(items, src_capacity, src_gaps, src_mem);
    KvLayout dst = raw_layout_in(items, dst_capacity, dst_gaps, dst_mem);
    std::vector<PageIndex> src_pages, dst_pages;
    random_pages(rng, src_capacity, dst_capacity, uniform(rng, 0, dst_capacity), src_pages,
                 dst_pages);
    const PlanOptions options = random_options(rng, src_pages.size());

    Result<TransferPlan> plan = build_transfer_plan(src, dst, src_pages, dst_pages, options);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    const std::vector<uint8_t> original = dst_mem.data;
    apply_plan(*plan, src_mem, dst_mem);
    const std::vector<uint8_t> planned = dst_mem.data;
    dst_mem.data = original;
    naive_copy(src, dst, src_pages, dst_pages);
    ASSERT_EQ(planned, dst_mem.data);
    uint64_t item_sum = 0;
    for (uint64_t item : items) item_sum += item;
    check_structure(*plan, options, src, src_pages.size(), item_sum);
  }
}

TEST(PlannerProperty, MhaAndMlaPoolsInBothPageOrdersMatchTheReference) {
  std::mt19937 rng(38984);
  for (int iteration = 0; iteration < kCases; ++iteration) {
    SCOPED_TRACE("case " + std::to_string(iteration));
    const bool mla = uniform(rng, 0, 3) == 0;
    const PageOrder src_order = uniform(rng, 0, 1) ? PageOrder::kPageMajor : PageOrder::kLayerMajor;
    const PageOrder dst_order = uniform(rng, 0, 1) ? PageOrder::kPageMajor : PageOrder::kLayerMajor;
    MhaShape mha{.num_layers = uniform(rng, 1, 4),
                 .page_size_tokens = uniform(rng, 1, 4),
                 .kv_heads = uniform(rng, 1, 2),
                 .k_head_dim = uniform(rng, 1, 4),
                 .v_head_dim = uniform(rng, 1, 4),
                 .dtype_bytes = uniform(rng, 1, 2)};
    MlaShape mla_shape{.num_layers = uniform(rng, 1, 4),
                       .page_size_tokens = uniform(rng, 1, 4),
                       .bytes_per_token = uniform(rng, 1, 24)};
    const uint32_t src_capacity = uniform(rng, 1, 20), dst_capacity = uniform(rng, 1, 20);
    auto bytes = [&](uint32_t pages) {
      if (mla) {
        MlaShape s = mla_shape;
        s.num_pages = pages;
        return *KvLayout::region_bytes(s);
      }
      MhaShape s = mha;
      s.num_pages = pages;
      return *KvLayout::region_bytes(s);
    };
    HostBuffer src_mem(bytes(src_capacity)), dst_mem(bytes(dst_capacity));
    src_mem.fill_random(iteration + 7);
    dst_mem.fill_random(iteration + 8);
    auto layout = [&](uint32_t pages, const HostBuffer& mem, PageOrder order) {
      if (mla) {
        MlaShape s = mla_shape;
        s.num_pages = pages;
        return *KvLayout::mla(s, mem.base(), order);
      }
      MhaShape s = mha;
      s.num_pages = pages;
      return *KvLayout::mha(s, mem.base(), order);
    };
    KvLayout src = layout(src_capacity, src_mem, src_order);
    KvLayout dst = layout(dst_capacity, dst_mem, dst_order);
    std::vector<PageIndex> src_pages, dst_pages;
    random_pages(rng, src_capacity, dst_capacity, uniform(rng, 0, dst_capacity), src_pages,
                 dst_pages);
    const PlanOptions options = random_options(rng, src_pages.size());

    Result<TransferPlan> plan = build_transfer_plan(src, dst, src_pages, dst_pages, options);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    std::vector<uint8_t> original = dst_mem.data;
    apply_plan(*plan, src_mem, dst_mem);
    std::vector<uint8_t> planned = dst_mem.data;
    dst_mem.data = original;
    naive_copy(src, dst, src_pages, dst_pages);
    ASSERT_EQ(planned, dst_mem.data);
    uint64_t item_sum = 0;
    for (const KvEntry& e : src.entries()) item_sum += e.item_len;
    check_structure(*plan, options, src, src_pages.size(), item_sum);
    if (options.coalesce && src_order == PageOrder::kPageMajor &&
        dst_order == PageOrder::kPageMajor && options.strategy == SendStrategy::kAllLayers &&
        !src_pages.empty()) {
      Result<std::vector<PageRun>> runs = group_page_runs(src_pages, dst_pages);
      EXPECT_LE(plan->num_blocks(), runs->size()) << "page-major: one block per run";
    }
  }
}

// Head-by-head reference for prefill TP != decode TP.
void naive_head_copy(const KvLayout& src, const KvLayout& dst, std::span<const PageIndex> sp,
                     std::span<const PageIndex> dp, const HeadSlice& slice, uint32_t page_size) {
  for (size_t e = 0; e < src.num_entries(); ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    const uint64_t src_token = s.item_len / page_size, dst_token = d.item_len / page_size;
    const uint64_t head = src_token / slice.src_heads_per_rank;
    for (size_t i = 0; i < sp.size(); ++i) {
      for (uint64_t t = 0; t < page_size; ++t) {
        for (uint64_t h = 0; h < slice.num_heads; ++h) {
          std::memcpy(reinterpret_cast<void*>(d.base + dp[i] * d.page_stride + t * dst_token +
                                              (slice.dst_head_start + h) * head),
                      reinterpret_cast<const void*>(s.base + sp[i] * s.page_stride + t * src_token +
                                                    (slice.src_head_start + h) * head),
                      head);
        }
      }
    }
  }
}

TEST(HeadSlicedPlannerProperty, EveryTpPairMatchesTheHeadByHeadReference) {
  std::mt19937 rng(4242);
  const uint32_t sizes[] = {1, 2, 4, 8};
  const uint32_t heads[] = {1, 2, 4, 8, 16};
  for (int iteration = 0; iteration < kCases; ++iteration) {
    SCOPED_TRACE("case " + std::to_string(iteration));
    TpPair tp;
    tp.prefill_tp_size = sizes[uniform(rng, 0, 3)];
    tp.decode_tp_size = sizes[uniform(rng, 0, 3)];
    tp.decode_tp_rank = uniform(rng, 0, tp.decode_tp_size - 1);
    std::vector<uint32_t> sources =
        *prefill_ranks_for_decode_rank(tp.prefill_tp_size, tp.decode_tp_size, tp.decode_tp_rank);
    tp.prefill_tp_rank = sources[uniform(rng, 0, static_cast<uint32_t>(sources.size()) - 1)];
    const uint32_t total_heads = heads[uniform(rng, 0, 4)];
    const HeadSlice slice = *compute_head_slice(tp, total_heads);

    MhaShape src_shape{.num_layers = uniform(rng, 1, 3),
                       .page_size_tokens = uniform(rng, 1, 4),
                       .kv_heads = slice.src_heads_per_rank,
                       .k_head_dim = uniform(rng, 1, 4),
                       .v_head_dim = uniform(rng, 1, 4),
                       .dtype_bytes = uniform(rng, 1, 2),
                       .num_pages = uniform(rng, 1, 12)};
    MhaShape dst_shape = src_shape;
    dst_shape.kv_heads = slice.dst_heads_per_rank;
    dst_shape.num_pages = uniform(rng, 1, 12);
    HostBuffer src_mem(*KvLayout::region_bytes(src_shape));
    HostBuffer dst_mem(*KvLayout::region_bytes(dst_shape));
    src_mem.fill_random(iteration * 3);
    dst_mem.fill_random(iteration * 5);
    const PageOrder dst_order = uniform(rng, 0, 1) ? PageOrder::kPageMajor : PageOrder::kLayerMajor;
    KvLayout src = *KvLayout::mha(src_shape, src_mem.base());
    KvLayout dst = *KvLayout::mha(dst_shape, dst_mem.base(), dst_order);
    std::vector<PageIndex> src_pages, dst_pages;
    random_pages(rng, static_cast<uint32_t>(src_shape.num_pages),
                 static_cast<uint32_t>(dst_shape.num_pages),
                 uniform(rng, 0, static_cast<uint32_t>(dst_shape.num_pages)), src_pages, dst_pages);
    const PlanOptions options = random_options(rng, src_pages.size());

    Result<TransferPlan> plan =
        build_head_sliced_plan(src, dst, src_pages, dst_pages, tp, total_heads, options);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    ASSERT_EQ(plan->num_calls(), expected_calls(options, src_pages.size(), src.num_entries()));
    if (!options.coalesce) {
      EXPECT_EQ(plan->num_blocks(),
                src.num_entries() * src_pages.size() * src_shape.page_size_tokens);
    }
    std::vector<uint8_t> original = dst_mem.data;
    apply_plan(*plan, src_mem, dst_mem);
    std::vector<uint8_t> planned = dst_mem.data;
    dst_mem.data = original;
    naive_head_copy(src, dst, src_pages, dst_pages, slice, src_shape.page_size_tokens);
    ASSERT_EQ(planned, dst_mem.data);
  }
}

}  // namespace
}  // namespace kvferry::kv
