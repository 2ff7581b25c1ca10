// Plan-building throughput (targets: >= 20 M blocks/s on one core, <= 32 bytes per
// block, a 128k-token deepseek-v3 plan with page size 64 and random pages in < 10 ms).
//
// Counters: blocks (after coalescing), calls, bytes_per_block (TransferPlan::memory_bytes /
// blocks) and blocks_per_second (the items/s column). The time column is the time to build
// one plan. Page lists are drawn once per benchmark; only plan building is timed. main() comes
// from benchmark::benchmark_main (CMakeLists.txt links every bench/*_bench.cc into one binary).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "kvferry/kv/page_runs.h"
#include "kvferry/kv/planner.h"

namespace kvferry::kv {
namespace {

constexpr uint32_t kPageSizeTokens = 64;
constexpr uint64_t kDstBase = uint64_t{1} << 40;  // layouts only describe memory; none is touched

enum class Allocation { kRandom, kRunsOf16, kContiguous };

// `pages` distinct pages out of a pool four times larger, in the given allocation pattern.
std::vector<PageIndex> allocate_pages(size_t pages, Allocation allocation, uint32_t seed) {
  const size_t pool = pages * 4;
  std::vector<PageIndex> all(pool);
  std::iota(all.begin(), all.end(), 0);
  std::mt19937 rng(seed);
  std::vector<PageIndex> out;
  out.reserve(pages);
  switch (allocation) {
    case Allocation::kContiguous:
      for (size_t i = 0; i < pages; ++i) out.push_back(static_cast<PageIndex>(pool / 2 + i));
      break;
    case Allocation::kRunsOf16: {
      std::vector<PageIndex> chunks(pool / 16);
      std::iota(chunks.begin(), chunks.end(), 0);
      std::shuffle(chunks.begin(), chunks.end(), rng);
      for (size_t c = 0; out.size() < pages; ++c) {
        for (PageIndex k = 0; k < 16 && out.size() < pages; ++k) out.push_back(chunks[c] * 16 + k);
      }
      break;
    }
    case Allocation::kRandom:
      std::shuffle(all.begin(), all.end(), rng);
      out.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(pages));
      break;
  }
  return out;
}

void report(benchmark::State& state, const TransferPlan& plan) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * plan.num_blocks()));
  state.counters["blocks"] = static_cast<double>(plan.num_blocks());
  state.counters["calls"] = static_cast<double>(plan.num_calls());
  state.counters["bytes_per_block"] =
      static_cast<double>(plan.memory_bytes()) / static_cast<double>(plan.num_blocks());
}

// deepseek-v3: MLA, 61 layers, 1152 bytes per token per layer, page size 64.
// Args: tokens, allocation, strategy.
void BM_DeepseekV3Plan(benchmark::State& state) {
  const size_t pages = static_cast<size_t>(state.range(0)) / kPageSizeTokens;
  const auto allocation = static_cast<Allocation>(state.range(1));
  const auto strategy = static_cast<SendStrategy>(state.range(2));
  MlaShape shape{.num_layers = 61,
                 .page_size_tokens = kPageSizeTokens,
                 .bytes_per_token = 1152,
                 .num_pages = pages * 4};
  const KvLayout src = *KvLayout::mla(shape, 0);
  const KvLayout dst = *KvLayout::mla(shape, kDstBase);
  const std::vector<PageIndex> src_pages = allocate_pages(pages, allocation, 1);
  const std::vector<PageIndex> dst_pages = allocate_pages(pages, allocation, 2);
  PlanOptions options{.strategy = strategy};
  if (strategy == SendStrategy::kIndexSharded) options.max_pages_per_call = 256;
  TransferPlan plan;
  for (auto _ : state) {
    plan = *build_transfer_plan(src, dst, src_pages, dst_pages, options);
    benchmark::DoNotOptimize(plan);
  }
  report(state, plan);
}

void DeepseekArgs(benchmark::internal::Benchmark* b) {
  for (int64_t tokens : {128, 1024, 4096, 16384, 131072}) {
    b->Args({tokens, static_cast<int64_t>(Allocation::kRandom),
             static_cast<int64_t>(SendStrategy::kAllLayers)});
  }
  for (auto strategy : {SendStrategy::kPerLayer, SendStrategy::kIndexSharded}) {
    b->Args({131072, static_cast<int64_t>(Allocation::kRandom), static_cast<int64_t>(strategy)});
  }
  for (auto allocation : {Allocation::kRunsOf16, Allocation::kContiguous}) {
    b->Args(
        {131072, static_cast<int64_t>(allocation), static_cast<int64_t>(SendStrategy::kAllLayers)});
  }
  b->ArgNames({"tokens", "alloc", "strategy"});
}
BENCHMARK(BM_DeepseekV3Plan)->Apply(DeepseekArgs)->Unit(benchmark::kMicrosecond);

// llama-3.1-8b on one rank: 32 layers, K and V of 8 heads x 128 x bf16, 128k tokens, random
// pages. Arg: page order (0 layer-major: 64 blocks per run; 1 page-major: one per run).
void BM_Llama31Plan(benchmark::State& state) {
  const size_t pages = 131072 / kPageSizeTokens;
  const auto order = static_cast<PageOrder>(state.range(0));
  MhaShape shape{.num_layers = 32,
                 .page_size_tokens = kPageSizeTokens,
                 .kv_heads = 8,
                 .k_head_dim = 128,
                 .v_head_dim = 128,
                 .dtype_bytes = 2,
                 .num_pages = pages * 4};
  const KvLayout src = *KvLayout::mha(shape, 0, order);
  const KvLayout dst = *KvLayout::mha(shape, kDstBase, order);
  const std::vector<PageIndex> src_pages = allocate_pages(pages, Allocation::kRandom, 3);
  const std::vector<PageIndex> dst_pages = allocate_pages(pages, Allocation::kRandom, 4);
  TransferPlan plan;
  for (auto _ : state) {
    plan = *build_transfer_plan(src, dst, src_pages, dst_pages);
    benchmark::DoNotOptimize(plan);
  }
  report(state, plan);
}
BENCHMARK(BM_Llama31Plan)->Arg(0)->Arg(1)->ArgName("page_major")->Unit(benchmark::kMicrosecond);

// llama-3.1-8b prefill TP 2 -> decode TP 4, 8 KV heads, 16k tokens: one block per token per
// entry (sglang's send_kvcache_slice), uncoalescable.
void BM_Llama31HeadSlicedPlan(benchmark::State& state) {
  const size_t pages = 16384 / kPageSizeTokens;
  MhaShape src_shape{.num_layers = 32,
                     .page_size_tokens = kPageSizeTokens,
                     .kv_heads = 4,
                     .k_head_dim = 128,
                     .v_head_dim = 128,
                     .dtype_bytes = 2,
                     .num_pages = pages * 4};
  MhaShape dst_shape = src_shape;
  dst_shape.kv_heads = 2;
  const KvLayout src = *KvLayout::mha(src_shape, 0);
  const KvLayout dst = *KvLayout::mha(dst_shape, kDstBase);
  const std::vector<PageIndex> src_pages = allocate_pages(pages, Allocation::kRandom, 5);
  const std::vector<PageIndex> dst_pages = allocate_pages(pages, Allocation::kRandom, 6);
  const TpPair tp{
      .prefill_tp_size = 2, .prefill_tp_rank = 0, .decode_tp_size = 4, .decode_tp_rank = 1};
  TransferPlan plan;
  for (auto _ : state) {
    plan = *build_head_sliced_plan(src, dst, src_pages, dst_pages, tp, 8);
    benchmark::DoNotOptimize(plan);
  }
  report(state, plan);
}
BENCHMARK(BM_Llama31HeadSlicedPlan)->Unit(benchmark::kMicrosecond);

// Grouping alone, 128k tokens at page size 1 (the worst case: one page per token).
void BM_GroupPageRuns(benchmark::State& state) {
  const size_t pages = 131072;
  const std::vector<PageIndex> src_pages = allocate_pages(pages, Allocation::kRunsOf16, 7);
  const std::vector<PageIndex> dst_pages = allocate_pages(pages, Allocation::kRunsOf16, 8);
  size_t runs = 0;
  for (auto _ : state) {
    std::vector<PageRun> out = *group_page_runs(src_pages, dst_pages);
    runs = out.size();
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * pages));
  state.counters["runs"] = static_cast<double>(runs);
}
BENCHMARK(BM_GroupPageRuns)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvferry::kv
