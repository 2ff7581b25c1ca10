// What registering and unregistering many regions costs per region: N 4 KiB regions carved
// from one mapping, registered in one register_memory call and unregistered in one
// unregister_memory call, on an engine serving only the local transport. The time column is
// the timed call alone (the other one runs untimed between iterations); us_per_region is it
// divided by N. Registration is O(log n) per region, so us_per_region should stay flat as N
// grows tenfold.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kvferry/transfer_engine.h"

namespace kvferry {
namespace {

constexpr size_t kRegionBytes = 4096;

// Private anonymous memory for `count` regions, unmapped on destruction. Never touched:
// registration reads /proc/self/maps, not the pages.
class Carved {
 public:
  explicit Carved(size_t count) : bytes_(count * kRegionBytes) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<char*>(p);
    for (size_t i = 0; i < count; ++i) {
      regions_.push_back({base_ + i * kRegionBytes, kRegionBytes, {}});
      addrs_.push_back(base_ + i * kRegionBytes);
    }
  }
  ~Carved() { ::munmap(base_, bytes_); }
  Carved(const Carved&) = delete;
  Carved& operator=(const Carved&) = delete;

  const std::vector<MemoryRegion>& regions() const { return regions_; }
  const std::vector<void*>& addrs() const { return addrs_; }

 private:
  size_t bytes_;
  char* base_ = nullptr;
  std::vector<MemoryRegion> regions_;
  std::vector<void*> addrs_;
};

std::unique_ptr<TransferEngine> local_engine() {
  EngineOptions options;
  options.name = "registration-bench";
  options.worker_threads = 1;
  options.allowed_transports = TransportSet{TransportKind::kLocal};
  Result<std::unique_ptr<TransferEngine>> engine = TransferEngine::create(options);
  if (!engine.ok()) std::abort();
  return std::move(engine).value();
}

enum class Timed { kRegister, kUnregister };

void run(benchmark::State& state, Timed timed) {
  const int64_t count = state.range(0);
  Carved carved(static_cast<size_t>(count));
  std::unique_ptr<TransferEngine> engine = local_engine();
  auto do_register = [&] { return engine->register_memory(carved.regions()); };
  auto do_unregister = [&] { return engine->unregister_memory(carved.addrs()); };
  double total_seconds = 0;
  for (auto _ : state) {
    // The untimed half of the pair runs outside the measured interval.
    Status before = timed == Timed::kUnregister ? do_register() : Status::Ok();
    const auto start = std::chrono::steady_clock::now();
    Status measured =
        before.ok() ? (timed == Timed::kRegister ? do_register() : do_unregister()) : before;
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    state.SetIterationTime(took.count());
    total_seconds += took.count();
    Status after = measured.ok() && timed == Timed::kRegister ? do_unregister() : measured;
    if (!after.ok()) {
      state.SkipWithError(after.to_string().c_str());
      break;
    }
  }
  if (state.iterations() > 0) {
    state.counters["us_per_region"] =
        total_seconds * 1e6 / static_cast<double>(state.iterations() * count);
  }
  state.SetItemsProcessed(state.iterations() * count);
}

void BM_RegisterRegions(benchmark::State& state) { run(state, Timed::kRegister); }
void BM_UnregisterRegions(benchmark::State& state) { run(state, Timed::kUnregister); }

BENCHMARK(BM_RegisterRegions)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->ArgName("regions")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_UnregisterRegions)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->ArgName("regions")
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvferry
