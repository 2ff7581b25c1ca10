// What submit's destination-overlap check costs on a 10,000-op batch, against the check every
// op already goes through (resolve_ops: both regions, route, merge) on the same ops in the
// same run. Ascending destinations (what the planner emits) take the one-pass path; shuffled
// ones are sorted. Report the ratio of the two time columns (docs/PERFORMANCE.md).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/op_resolver.h"

namespace kvferry {
namespace {

constexpr size_t kOps = 10'000;
constexpr uint64_t kOpBytes = 4096;
constexpr uint64_t kSrcBase = uint64_t{1} << 40;
constexpr uint64_t kDstBase = uint64_t{2} << 40;

// Every other block: nothing merges, so resolve_ops does its whole per-op work.
std::vector<TransferOp> make_ops(bool shuffled) {
  std::vector<TransferOp> ops;
  ops.reserve(kOps);
  for (size_t i = 0; i < kOps; ++i) {
    ops.push_back(
        {OpKind::kWrite, kSrcBase + 2 * i * kOpBytes, kDstBase + 2 * i * kOpBytes, kOpBytes});
  }
  if (shuffled) std::shuffle(ops.begin(), ops.end(), std::mt19937_64(7));
  return ops;
}

RegionIndex one_region(uint64_t base) {
  RegionEntries entries(1);
  entries[0].addr = base;
  entries[0].length = 2 * kOps * kOpBytes;
  entries[0].host_ptr = reinterpret_cast<char*>(base);  // never dereferenced
  return RegionIndex(std::move(entries));
}

void BM_ResolveOps(benchmark::State& state) {
  const std::vector<TransferOp> ops = make_ops(state.range(0) != 0);
  const RegionIndex local = one_region(kSrcBase);
  const RegionIndex remote = one_region(kDstBase);
  for (auto _ : state) {
    ResolvedOps r = resolve_ops(ops, local, remote, "bench", true, CopyAccess::kHostPointers);
    benchmark::DoNotOptimize(r.batch.bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kOps));
}
BENCHMARK(BM_ResolveOps)->Arg(0)->Arg(1)->ArgName("shuffled")->Unit(benchmark::kMicrosecond);

void BM_CheckDisjointDestinations(benchmark::State& state) {
  const std::vector<TransferOp> ops = make_ops(state.range(0) != 0);
  for (auto _ : state) {
    Status s = check_disjoint_destinations(ops, false);
    benchmark::DoNotOptimize(s.ok());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kOps));
}
BENCHMARK(BM_CheckDisjointDestinations)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("shuffled")
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvferry
