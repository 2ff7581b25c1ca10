// Transfer plans executed on real engines: every strategy, on the local transport (one engine
// writing to itself), on shm between two engines of this process, and on shm into a
// `kvferry serve` child process. Every test checks the bytes of every destination page of
// every entry against the source, and that no page outside the request was written.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/pattern.h"
#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/planner.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry::kv {
namespace {

using kvferry::testing::addr_of;
using kvferry::testing::make_engine;
using kvferry::testing::must;

constexpr uint64_t kPoolPages = 32;
constexpr size_t kRequestPages = 12;
constexpr uint32_t kPageSizeTokens = 4;
constexpr uint64_t kSourceSeed = 11;
constexpr uint64_t kUntouchedSeed = 12;  // what a serve child's pool holds before a transfer
constexpr auto kChildTimeout = std::chrono::seconds(10);

enum class Model { kMha, kMla };

// MHA: 3 layers of K (2 heads x 8 x 2 bytes) and V (2 heads x 4 x 2 bytes): K and V item
// lengths differ. MLA: 4 layers of 24 bytes per token.
MhaShape mha_shape(uint32_t kv_heads = 2) {
  return MhaShape{.num_layers = 3,
                  .page_size_tokens = kPageSizeTokens,
                  .kv_heads = kv_heads,
                  .k_head_dim = 8,
                  .v_head_dim = 4,
                  .dtype_bytes = 2,
                  .num_pages = kPoolPages};
}

MlaShape mla_shape() {
  return MlaShape{.num_layers = 4,
                  .page_size_tokens = kPageSizeTokens,
                  .bytes_per_token = 24,
                  .num_pages = kPoolPages};
}

uint64_t region_bytes(Model model) {
  return must(model == Model::kMha ? KvLayout::region_bytes(mha_shape())
                                   : KvLayout::region_bytes(mla_shape()));
}

KvLayout layout_at(Model model, uint64_t base) {
  return must(model == Model::kMha ? KvLayout::mha(mha_shape(), base)
                                   : KvLayout::mla(mla_shape(), base));
}

enum class Placement { kRandom, kRunsOfThree };

// kRequestPages distinct pages of the pool: a random permutation, or shuffled runs of three
// (so both sides step by +1 inside a run and grouping has runs to find).
std::vector<PageIndex> place_pages(Placement placement, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<PageIndex> out;
  if (placement == Placement::kRandom) {
    std::vector<PageIndex> all(kPoolPages);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    out.assign(all.begin(), all.begin() + kRequestPages);
    return out;
  }
  std::vector<PageIndex> runs(kPoolPages / 3);
  std::iota(runs.begin(), runs.end(), 0);
  std::shuffle(runs.begin(), runs.end(), rng);
  for (size_t r = 0; out.size() < kRequestPages; ++r) {
    for (PageIndex k = 0; k < 3 && out.size() < kRequestPages; ++k) out.push_back(runs[r] * 3 + k);
  }
  return out;
}

struct StrategyCase {
  SendStrategy strategy;
  uint32_t max_pages_per_call;
  const char* name;
};

// index_sharded with B smaller than (and not dividing), equal to and larger than the pages.
const StrategyCase kStrategyCases[] = {
    {SendStrategy::kAllLayers, 0, "AllLayers"},
    {SendStrategy::kPerLayer, 0, "PerLayer"},
    {SendStrategy::kIndexSharded, 5, "IndexShardedBelowPageCount"},
    {SendStrategy::kIndexSharded, kRequestPages, "IndexShardedAtPageCount"},
    {SendStrategy::kIndexSharded, kRequestPages + 7, "IndexShardedAbovePageCount"},
};

// Readable parameters in gtest's failure messages.
void PrintTo(const StrategyCase& c, std::ostream* os) { *os << c.name; }
void PrintTo(Model model, std::ostream* os) { *os << (model == Model::kMha ? "MHA" : "MLA"); }

PlanOptions options_for(const StrategyCase& c) {
  return PlanOptions{.strategy = c.strategy, .max_pages_per_call = c.max_pages_per_call};
}

size_t expected_calls(const StrategyCase& c, const KvLayout& layout) {
  switch (c.strategy) {
    case SendStrategy::kAllLayers: return 1;
    case SendStrategy::kPerLayer: return layout.num_entries();
    case SendStrategy::kIndexSharded:
      return (kRequestPages + c.max_pages_per_call - 1) / c.max_pages_per_call;
  }
  return 0;
}

// Checks, entry by entry and page by page, that each requested destination page holds its
// source page and every other destination page is still zero.
void expect_exactly_the_request_moved(const KvLayout& src, const KvLayout& dst,
                                      std::span<const PageIndex> src_pages,
                                      std::span<const PageIndex> dst_pages) {
  const std::set<PageIndex> requested(dst_pages.begin(), dst_pages.end());
  for (size_t e = 0; e < src.num_entries(); ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    for (size_t i = 0; i < src_pages.size(); ++i) {
      const auto* from = reinterpret_cast<const std::byte*>(s.base + src_pages[i] * s.page_stride);
      const auto* to = reinterpret_cast<const std::byte*>(d.base + dst_pages[i] * d.page_stride);
      ASSERT_EQ(std::memcmp(to, from, s.item_len), 0)
          << "entry " << e << ": page " << src_pages[i] << " -> " << dst_pages[i];
    }
    for (PageIndex p = 0; p < kPoolPages; ++p) {
      if (requested.contains(p)) continue;
      const auto* page = reinterpret_cast<const std::byte*>(d.base + p * d.page_stride);
      ASSERT_TRUE(
          std::all_of(page, page + d.item_len, [](std::byte b) { return b == std::byte{0}; }))
          << "entry " << e << ": destination page " << p << " is not part of the request";
    }
  }
}

enum class InProcessTransport { kLocal, kShm };

using ExecutionParam = std::tuple<Model, InProcessTransport, Placement, StrategyCase>;

class PlanExecution : public ::testing::TestWithParam<ExecutionParam> {};

TEST_P(PlanExecution, EveryDestinationPageHoldsItsSourcePageAndNothingElseIsWritten) {
  const auto [model, transport, placement, strategy_case] = GetParam();
  const uint64_t bytes = region_bytes(model);
  std::vector<std::byte> src_region(bytes);
  fill_pattern(src_region, kSourceSeed);
  auto prefill = make_engine("prefill");
  ASSERT_TRUE(prefill->register_memory(src_region.data(), bytes).ok());

  std::unique_ptr<TransferEngine> decode;
  std::vector<std::byte> local_dst;
  void* dst_addr = nullptr;
  PeerHandle peer;
  if (transport == InProcessTransport::kLocal) {
    local_dst.assign(bytes, std::byte{0});
    dst_addr = local_dst.data();
    ASSERT_TRUE(prefill->register_memory(dst_addr, bytes).ok());
    peer = must(prefill->open_peer(prefill->endpoint()));
    ASSERT_EQ(peer.transport(), TransportKind::kLocal);
  } else {
    decode = make_engine("decode");
    dst_addr = must(decode->allocate_shared(bytes)).addr;  // a fresh memfd reads as zeros
    peer = must(prefill->open_peer(decode->endpoint()));
    ASSERT_EQ(peer.transport(), TransportKind::kShm);
  }

  const KvLayout src = layout_at(model, addr_of(src_region.data()));
  const KvLayout dst = layout_at(model, addr_of(dst_addr));
  const std::vector<PageIndex> src_pages = place_pages(placement, 1);
  const std::vector<PageIndex> dst_pages = place_pages(placement, 2);
  const TransferPlan plan =
      must(build_transfer_plan(src, dst, src_pages, dst_pages, options_for(strategy_case)));
  ASSERT_EQ(plan.num_calls(), expected_calls(strategy_case, src));

  const Status status = execute(plan, *prefill, peer);
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_exactly_the_request_moved(src, dst, src_pages, dst_pages);
}

std::string param_name(const ::testing::TestParamInfo<ExecutionParam>& info) {
  const auto [model, transport, placement, strategy_case] = info.param;
  return fmt::format("{}_{}_{}_{}", model == Model::kMha ? "Mha" : "Mla",
                     transport == InProcessTransport::kLocal ? "Local" : "Shm",
                     placement == Placement::kRandom ? "RandomPages" : "RunsOfThree",
                     strategy_case.name);
}

INSTANTIATE_TEST_SUITE_P(
    AllStrategies, PlanExecution,
    ::testing::Combine(::testing::Values(Model::kMha, Model::kMla),
                       ::testing::Values(InProcessTransport::kLocal, InProcessTransport::kShm),
                       ::testing::Values(Placement::kRandom, Placement::kRunsOfThree),
                       ::testing::ValuesIn(kStrategyCases)),
    param_name);

TEST(PlanExecutionByRead, DecodePullsEveryPageFromThePrefillEngineOverShm) {
  // The decode engine runs the plan with READ: its local side is the plan's destination.
  const uint64_t bytes = region_bytes(Model::kMla);
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  SharedBuffer src_buffer = must(prefill->allocate_shared(bytes));
  fill_pattern({static_cast<std::byte*>(src_buffer.addr), bytes}, kSourceSeed);
  std::vector<std::byte> dst_region(bytes, std::byte{0});
  ASSERT_TRUE(decode->register_memory(dst_region.data(), bytes).ok());
  PeerHandle peer = must(decode->open_peer(prefill->endpoint()));
  ASSERT_EQ(peer.transport(), TransportKind::kShm);

  const KvLayout src = layout_at(Model::kMla, addr_of(src_buffer.addr));
  const KvLayout dst = layout_at(Model::kMla, addr_of(dst_region.data()));
  const std::vector<PageIndex> src_pages = place_pages(Placement::kRandom, 3);
  const std::vector<PageIndex> dst_pages = place_pages(Placement::kRandom, 4);
  const TransferPlan plan = must(
      build_transfer_plan(src, dst, src_pages, dst_pages, {.strategy = SendStrategy::kPerLayer}));
  const Status status = execute(plan, *decode, peer, {.kind = OpKind::kRead});
  ASSERT_TRUE(status.ok()) << status.to_string();
  expect_exactly_the_request_moved(src, dst, src_pages, dst_pages);
}

// --- Across processes: the destination pool is the shared buffer of a `kvferry serve` child.

class ServeChildExecution : public ::testing::TestWithParam<Model> {};

TEST_P(ServeChildExecution, EveryStrategyLandsEveryPageInTheChildsMemory) {
  const Model model = GetParam();
  const uint64_t bytes = region_bytes(model);
  cli::ServePeer child = must(cli::start_serve_peer(KVFERRY_CLI_PATH, bytes));
  ASSERT_GE(child.bytes, bytes);
  auto prefill = make_engine("prefill");
  std::vector<std::byte> src_region(bytes);
  ASSERT_TRUE(prefill->register_memory(src_region.data(), bytes).ok());
  PeerHandle peer = must(prefill->open_peer(child.endpoint));
  ASSERT_EQ(peer.transport(), TransportKind::kShm);

  const KvLayout src = layout_at(model, addr_of(src_region.data()));
  const KvLayout dst = layout_at(model, child.addr);
  const std::vector<PageIndex> src_pages = place_pages(Placement::kRandom, 5);
  const std::vector<PageIndex> dst_pages = place_pages(Placement::kRandom, 6);
  const std::set<PageIndex> requested(dst_pages.begin(), dst_pages.end());

  for (const StrategyCase& strategy_case : kStrategyCases) {
    SCOPED_TRACE(strategy_case.name);
    // The child's pool starts as one pattern; each source page holds the pattern the child
    // expects at its destination offset, so the child checks bytes without being sent them.
    ASSERT_EQ(
        must(child.process.ask(fmt::format("fill {} 0 {}", kUntouchedSeed, bytes), kChildTimeout)),
        "ok");
    for (size_t e = 0; e < src.num_entries(); ++e) {
      const KvEntry& s = src.entry(e);
      const KvEntry& d = dst.entry(e);
      for (size_t i = 0; i < src_pages.size(); ++i) {
        auto* page = reinterpret_cast<std::byte*>(s.base + src_pages[i] * s.page_stride);
        fill_pattern({page, s.item_len}, kSourceSeed,
                     d.base + dst_pages[i] * d.page_stride - child.addr);
      }
    }
    const TransferPlan plan =
        must(build_transfer_plan(src, dst, src_pages, dst_pages, options_for(strategy_case)));
    const Status status = execute(plan, *prefill, peer);
    ASSERT_TRUE(status.ok()) << status.to_string();

    for (size_t e = 0; e < dst.num_entries(); ++e) {
      const KvEntry& d = dst.entry(e);
      for (PageIndex p = 0; p < kPoolPages; ++p) {
        const uint64_t offset = d.base + p * d.page_stride - child.addr;
        const uint64_t seed = requested.contains(p) ? kSourceSeed : kUntouchedSeed;
        ASSERT_EQ(must(child.process.ask(fmt::format("verify {} {} {}", seed, offset, d.item_len),
                                         kChildTimeout)),
                  "ok")
            << "entry " << e << ", destination page " << p
            << (requested.contains(p) ? " (requested)" : " (not requested)");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothModels, ServeChildExecution,
                         ::testing::Values(Model::kMha, Model::kMla),
                         [](const ::testing::TestParamInfo<Model>& model) {
                           return std::string(model.param == Model::kMha ? "Mha" : "Mla");
                         });

// --- TP mismatch: head-sliced plans on the local transport, checked head slice by head slice.

struct HeadSliceCase {
  TpPair tp;
  uint32_t total_kv_heads;
  const char* name;
};

void PrintTo(const HeadSliceCase& c, std::ostream* os) { *os << c.name; }

class HeadSlicedExecution : public ::testing::TestWithParam<HeadSliceCase> {};

TEST_P(HeadSlicedExecution, EachTokenSlotReceivesExactlyItsHeadSlice) {
  const HeadSliceCase c = GetParam();
  const HeadSlice slice = must(compute_head_slice(c.tp, c.total_kv_heads));
  const MhaShape src_shape = mha_shape(slice.src_heads_per_rank);
  const MhaShape dst_shape = mha_shape(slice.dst_heads_per_rank);
  const uint64_t src_bytes = must(KvLayout::region_bytes(src_shape));
  const uint64_t dst_bytes = must(KvLayout::region_bytes(dst_shape));
  std::vector<std::byte> src_region(src_bytes);
  std::vector<std::byte> dst_region(dst_bytes, std::byte{0});
  fill_pattern(src_region, kSourceSeed);
  auto engine = make_engine("tp");
  ASSERT_TRUE(engine->register_memory(src_region.data(), src_bytes).ok());
  ASSERT_TRUE(engine->register_memory(dst_region.data(), dst_bytes).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));

  const KvLayout src = must(KvLayout::mha(src_shape, addr_of(src_region.data())));
  const KvLayout dst = must(KvLayout::mha(dst_shape, addr_of(dst_region.data())));
  const std::vector<PageIndex> src_pages = place_pages(Placement::kRandom, 7);
  const std::vector<PageIndex> dst_pages = place_pages(Placement::kRandom, 8);
  const TransferPlan plan =
      must(build_head_sliced_plan(src, dst, src_pages, dst_pages, c.tp, c.total_kv_heads));
  const Status status = execute(plan, *engine, self);
  ASSERT_TRUE(status.ok()) << status.to_string();

  // Token slots are [head][head_dim] of dtype; K and V entries differ in head_dim.
  for (size_t e = 0; e < src.num_entries(); ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    const uint64_t head_bytes = s.item_len / kPageSizeTokens / slice.src_heads_per_rank;
    const uint64_t src_token = head_bytes * slice.src_heads_per_rank;
    const uint64_t dst_token = head_bytes * slice.dst_heads_per_rank;
    ASSERT_EQ(dst_token * kPageSizeTokens, d.item_len);
    for (size_t i = 0; i < src_pages.size(); ++i) {
      for (uint64_t t = 0; t < kPageSizeTokens; ++t) {
        const auto* from =
            reinterpret_cast<const std::byte*>(s.base + src_pages[i] * s.item_len + t * src_token);
        const auto* to =
            reinterpret_cast<const std::byte*>(d.base + dst_pages[i] * d.item_len + t * dst_token);
        for (uint32_t h = 0; h < slice.dst_heads_per_rank; ++h) {
          const bool in_slice =
              h >= slice.dst_head_start && h < slice.dst_head_start + slice.num_heads;
          const std::byte* got = to + h * head_bytes;
          if (in_slice) {
            const std::byte* want =
                from + (slice.src_head_start + h - slice.dst_head_start) * head_bytes;
            ASSERT_EQ(std::memcmp(got, want, head_bytes), 0)
                << "entry " << e << " page " << dst_pages[i] << " token " << t << " head " << h;
          } else {
            ASSERT_TRUE(
                std::all_of(got, got + head_bytes, [](std::byte b) { return b == std::byte{0}; }))
                << "entry " << e << " page " << dst_pages[i] << " token " << t << " head " << h
                << " belongs to another prefill rank";
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TpMismatch, HeadSlicedExecution,
    ::testing::Values(
        // Scatter: P=1 holds 4 heads, decode rank 1 of D=2 takes heads 2..3.
        HeadSliceCase{TpPair{1, 0, 2, 1}, 4, "ScatterOneToTwo"},
        // Gather: prefill rank 1 of P=2 holds heads 2..3 and fills them in D=1's slot.
        HeadSliceCase{TpPair{2, 1, 1, 0}, 4, "GatherTwoToOne"}),
    [](const ::testing::TestParamInfo<HeadSliceCase>& slice_case) {
      return std::string(slice_case.param.name);
    });

}  // namespace
}  // namespace kvferry::kv
