// `kvferry bench kv`: end-to-end latency of moving one request's KV cache with each send
// strategy, against a memcpy of the same blocks on the same threads, measured in the same run.
//
// A cell is (preset, tokens, transport, threads). The source pool is local registered memory.
// The destination pool is shared memory: allocated by a holder engine in this process for
// transport local (and reused as the memcpy reference's destination, so engine and memcpy
// write the same kind of pages), or by a `kvferry serve` child for transports shm, tcp, ucx
// (with `--memory host`, plain registered memory, for cma). Pools hold
// pool_slack x the request's pages so random and run placements spread over a realistic
// address range. Each strategy row reports the plan (calls, blocks after coalescing, build
// time, bytes), the request latency, and two time ratios: against per_layer (the seed's
// comparison) and against the memcpy reference. GB/s and ratios use medians, which shrug off
// the odd sample stolen by other work on a shared machine.
//
// A separate row per transport and thread count measures the fixed cost of one engine call:
// submit to completion of a one-block 64-byte call.
//
// With --integrity, each cell also times the all-layers request with opt-in integrity
// (PdIntegrity) against the same request without it, interleaved: the transfer, then what
// the PD layer adds on the critical path, the sender's digests of its source pages
// (PageDigester) and decode's verification of the landed pages (verify_pages, here over the
// local copy of the destination pool that the memcpy reference fills: the same bytes at the
// same offsets, readable from this process).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <latch>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "commands.h"
#include "core/pattern.h"
#include "core/thread_pool.h"
#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/planner.h"
#include "kvferry/transfer_engine.h"
#include "pd/page_integrity.h"
#include "progress.h"
#include "serve_client.h"
#include "transport/built_transports.h"

namespace kvferry::cli {
namespace {

using kv::KvLayout;
using kv::PageIndex;
using kv::SendStrategy;
using kv::TransferPlan;

constexpr uint32_t kBf16Bytes = 2;
constexpr uint64_t kCallCostBytes = 64;
constexpr uint64_t kPatternSeed = 0x6b76;  // "kv"
constexpr uint32_t kSrcPlacementSeed = 1;
constexpr uint32_t kDstPlacementSeed = 2;
constexpr auto kChildTimeout = std::chrono::seconds(30);

// The KV shape of one rank of a model. MLA presets use bytes_per_token; MHA/GQA presets K and
// V of kv_heads x head_dim bf16 values per token.
struct KvPreset {
  std::string_view name;
  bool mla = false;
  uint32_t num_layers = 0;
  uint32_t mla_bytes_per_token = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
};

constexpr KvPreset kPresets[] = {
    {.name = "deepseek-v3", .mla = true, .num_layers = 61, .mla_bytes_per_token = 1152},
    {.name = "llama-3.1-8b", .num_layers = 32, .kv_heads = 8, .head_dim = 128},
    {.name = "qwen3-235b", .num_layers = 94, .kv_heads = 4, .head_dim = 128},
};

Result<KvPreset> find_preset(std::string_view name) {
  std::string valid;
  for (const KvPreset& p : kPresets) {
    if (p.name == name) return p;
    valid += (valid.empty() ? "" : ", ") + std::string(p.name);
  }
  return InvalidArgument(fmt::format("unknown preset '{}' (valid: {})", name, valid));
}

kv::MlaShape mla_shape(const KvPreset& p, uint32_t page_size, uint64_t pool_pages) {
  return {.num_layers = p.num_layers,
          .page_size_tokens = page_size,
          .bytes_per_token = p.mla_bytes_per_token,
          .num_pages = pool_pages};
}

kv::MhaShape mha_shape(const KvPreset& p, uint32_t page_size, uint64_t pool_pages) {
  return {.num_layers = p.num_layers,
          .page_size_tokens = page_size,
          .kv_heads = p.kv_heads,
          .k_head_dim = p.head_dim,
          .v_head_dim = p.head_dim,
          .dtype_bytes = kBf16Bytes,
          .num_pages = pool_pages};
}

Result<uint64_t> pool_bytes(const KvPreset& p, uint32_t page_size, uint64_t pool_pages) {
  return p.mla ? KvLayout::region_bytes(mla_shape(p, page_size, pool_pages))
               : KvLayout::region_bytes(mha_shape(p, page_size, pool_pages));
}

Result<KvLayout> pool_layout(const KvPreset& p, uint32_t page_size, uint64_t pool_pages,
                             uint64_t base) {
  return p.mla ? KvLayout::mla(mla_shape(p, page_size, pool_pages), base)
               : KvLayout::mha(mha_shape(p, page_size, pool_pages), base);
}

// Where a request's pages sit in its pool. kFreedRuns: runs of run_pages in random places,
// each listed from its last page down, as vLLM's free queue hands out the blocks of requests
// it freed last first.
enum class PageAllocation { kContiguous, kRuns, kFreedRuns, kRandom };

struct PagePlacement {
  PageAllocation allocation = PageAllocation::kRandom;
  uint32_t run_pages = 1;  // kRuns, kFreedRuns
};

Result<PagePlacement> parse_page_placement(std::string_view text) {
  if (text == "contiguous") return PagePlacement{PageAllocation::kContiguous, 1};
  if (text == "random") return PagePlacement{PageAllocation::kRandom, 1};
  for (const auto& [prefix, allocation] :
       {std::pair{std::string_view("runs:"), PageAllocation::kRuns},
        std::pair{std::string_view("freed:"), PageAllocation::kFreedRuns}}) {
    if (!text.starts_with(prefix)) continue;
    const std::string count(text.substr(prefix.size()));
    char* end = nullptr;
    const unsigned long n = std::strtoul(count.c_str(), &end, 10);
    if (!count.empty() && *end == '\0' && n > 0 && n <= (1u << 20)) {
      return PagePlacement{allocation, static_cast<uint32_t>(n)};
    }
  }
  return InvalidArgument(fmt::format(
      "unknown page placement '{}' (valid: contiguous, runs:N or freed:N with N > 0, random)",
      text));
}

// Pool pages for a request of `pages`: slack for placement, rounded to whole runs.
uint64_t pool_pages_for(uint64_t pages, double slack, const PagePlacement& placement) {
  uint64_t pool = std::max<uint64_t>(pages, static_cast<uint64_t>(std::ceil(pages * slack)));
  const uint64_t run = placement.run_pages;
  return (pool + run - 1) / run * run;
}

// `pages` distinct pages of a pool of `pool_pages`.
std::vector<PageIndex> place_pages(uint64_t pages, uint64_t pool_pages,
                                   const PagePlacement& placement, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<PageIndex> out;
  out.reserve(pages);
  switch (placement.allocation) {
    case PageAllocation::kContiguous: {
      const uint64_t first = (pool_pages - pages) / 2;
      for (uint64_t i = 0; i < pages; ++i) out.push_back(static_cast<PageIndex>(first + i));
      break;
    }
    case PageAllocation::kRuns:
    case PageAllocation::kFreedRuns: {
      std::vector<PageIndex> runs(pool_pages / placement.run_pages);
      std::iota(runs.begin(), runs.end(), 0);
      std::shuffle(runs.begin(), runs.end(), rng);
      const bool down = placement.allocation == PageAllocation::kFreedRuns;
      for (size_t r = 0; out.size() < pages; ++r) {
        for (uint32_t k = 0; k < placement.run_pages && out.size() < pages; ++k) {
          out.push_back(runs[r] * placement.run_pages + (down ? placement.run_pages - 1 - k : k));
        }
      }
      break;
    }
    case PageAllocation::kRandom: {
      std::vector<PageIndex> all(pool_pages);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      out.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(pages));
      break;
    }
  }
  return out;
}

struct KvBenchArgs {
  std::vector<std::string> presets = {"deepseek-v3"};
  std::vector<uint64_t> tokens = {128, 1024, 4096, 16384};
  uint32_t page_size = 64;
  std::string pages = "random";
  std::vector<std::string> strategies = {"all_layers", "per_layer", "index_sharded"};
  uint32_t max_pages_per_call = 64;
  std::vector<std::string> transports = {"local", "shm"};
  std::vector<int> threads = {1, 2};
  std::string cma_peer_memory = "host";  // the serve child's --memory for cma
  int min_time_ms = 200;
  // Rounds at least (each strategy one call per round): a 16k-token call takes ~100 ms, so
  // min_time_ms alone leaves a handful of samples, and one slow call moves the p50.
  size_t min_rounds = 3;
  double pool_slack = 2.0;
  double max_memory_gib = 12.0;
  uint64_t inline_bytes = EngineOptions{}.inline_batch_bytes;
  // EngineOptions::metrics for the call-cost engines, each measured in turn ("off,on": the
  // cost of metrics against a same-run reference); the grid's engines use the last one.
  std::vector<std::string> metrics = {"off"};
  bool integrity = false;  // also time all_layers with PdIntegrity's digests and verification
  std::string json_path;
};

// One call per contestant per round, for min_time_ms per contestant and min_rounds rounds.
InterleaveOptions interleave_options(const KvBenchArgs& args, size_t contestants) {
  InterleaveOptions o;
  o.min_time_ms = args.min_time_ms * static_cast<int>(contestants);
  o.min_rounds = args.min_rounds;
  return o;
}

struct StrategyPlan {
  SendStrategy strategy;
  TransferPlan plan;
  double build_us = 0;
};

struct KvRow {
  std::string preset;
  uint64_t tokens = 0;
  std::string strategy;
  std::string transport;
  int threads = 0;
  uint64_t bytes = 0;
  size_t calls = 0;
  size_t blocks = 0;
  double plan_build_us = 0;
  size_t plan_bytes = 0;
  double p50_us = 0;
  double p99_us = 0;
  double gbps = 0;
  double memcpy_p50_us = 0;
  std::optional<double> time_vs_per_layer;
  double time_vs_memcpy = 0;
};

// The all-layers request with and without integrity, in one cell.
struct IntegrityRow {
  std::string preset;
  uint64_t tokens = 0;
  std::string transport;
  int threads = 0;
  uint64_t bytes = 0;
  double plain_p50_us = 0;
  double integrity_p50_us = 0;
  double ratio = 0;  // integrity_p50_us / plain_p50_us
};

struct CallCostRow {
  std::string transport;
  int threads = 0;
  bool metrics = false;
  double p50_us = 0;
  double p99_us = 0;
  double mean_us = 0;
};

// One block of the memcpy reference.
struct Copy {
  std::byte* dst;
  const std::byte* src;
  uint64_t len;
};

// memcpy of a list of variable-length blocks on `threads` threads (the caller plus a pool),
// split by bytes so every thread copies the same amount, cutting inside blocks if needed.
class BlockCopier {
 public:
  BlockCopier(std::vector<Copy> copies, int threads)
      : copies_(std::move(copies)), threads_(threads), pool_(threads - 1) {
    ends_.reserve(copies_.size());
    for (const Copy& c : copies_) ends_.push_back(total_ += c.len);
  }

  void run_one_thread() const {
    for (const Copy& c : copies_) std::memcpy(c.dst, c.src, c.len);
  }

  void run_all_threads() {
    const uint64_t share = (total_ + threads_ - 1) / threads_;
    std::latch done(threads_);
    auto part = [&](int t) {
      uint64_t begin = std::min(total_, share * t);
      const uint64_t end = std::min(total_, begin + share);
      // First block that ends after `begin`.
      size_t i = std::upper_bound(ends_.begin(), ends_.end(), begin) - ends_.begin();
      while (begin < end) {
        const uint64_t block_start = ends_[i] - copies_[i].len;
        const uint64_t offset = begin - block_start;
        const uint64_t n = std::min(copies_[i].len - offset, end - begin);
        std::memcpy(copies_[i].dst + offset, copies_[i].src + offset, n);
        begin += n;
        ++i;
      }
      done.count_down();
    };
    for (int t = 1; t < threads_; ++t) {
      if (!pool_.post([&part, t] { part(t); }).ok()) part(t);  // no thread: here
    }
    part(0);
    done.wait();
  }

 private:
  std::vector<Copy> copies_;
  std::vector<uint64_t> ends_;  // prefix sums of the lengths
  uint64_t total_ = 0;
  int threads_;
  ThreadPool pool_;
};

// Host memory left untouched until first used, so a large pool costs nothing until a cell
// writes into it.
struct HostPool {
  explicit HostPool(uint64_t bytes)
      : data(std::make_unique_for_overwrite<std::byte[]>(bytes)), size(bytes) {}
  uint64_t base() const { return reinterpret_cast<uint64_t>(data.get()); }
  std::unique_ptr<std::byte[]> data;
  uint64_t size;
};

// Runs the plan end to end; false (with `failure` set) on error.
bool execute_once(const TransferPlan& plan, TransferEngine& engine, const PeerHandle& peer,
                  Status& failure) {
  failure = kv::execute(plan, engine, peer);
  return failure.ok();
}

Result<std::unique_ptr<TransferEngine>> make_engine(int threads, uint64_t inline_bytes,
                                                    bool metrics) {
  EngineOptions options;
  options.name = "bench-kv";
  options.metrics = metrics;
  options.worker_threads = threads;
  options.inline_batch_bytes = inline_bytes;
  return TransferEngine::create(options);
}

// Submit to completion of a one-block call, on the local transport and on shm to a small
// `kvferry serve` child.
Status measure_call_cost(const KvBenchArgs& args, std::vector<CallCostRow>& rows) {
  std::vector<std::byte> src(kCallCostBytes);
  std::vector<std::byte> local_dst(kCallCostBytes);
  fill_pattern(src, kPatternSeed);
  std::unique_ptr<ServePeer> serve;
  for (const std::string& transport_name : args.transports) {
    KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(transport_name));
    if (transport != TransportKind::kLocal && !serve) {
      KVF_ASSIGN_OR_RETURN(ServePeer peer, start_serve_peer(self_executable(), 1 << 20));
      serve = std::make_unique<ServePeer>(std::move(peer));
    }
    for (int threads : args.threads) {
      for (const std::string& metrics_mode : args.metrics) {
        const bool metrics = metrics_mode == "on";
        KVF_ASSIGN_OR_RETURN(auto engine, make_engine(threads, args.inline_bytes, metrics));
        KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));
        KVF_RETURN_IF_ERROR(engine->register_memory(local_dst.data(), local_dst.size()));
        const bool shm = transport != TransportKind::kLocal;  // shm or tcp: the child process
        PeerOptions peer_options;
        peer_options.transport = transport;
        KVF_ASSIGN_OR_RETURN(
            PeerHandle peer,
            engine->open_peer(shm ? serve->endpoint : engine->endpoint(), peer_options));
        const TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                            shm ? serve->addr : reinterpret_cast<uint64_t>(local_dst.data()),
                            kCallCostBytes};
        Status failure;
        LatencySampler latency;
        latency.run(args.min_time_ms, [&] {
          Result<BatchHandle> batch = engine->submit(peer, {&op, 1});
          if (!batch.ok()) {
            failure = batch.status();
            return false;
          }
          BatchStatus status = engine->wait(*batch, std::chrono::seconds(10));
          failure = status.status;
          return status.state == BatchState::kCompleted;
        });
        KVF_RETURN_IF_ERROR(failure);
        CallCostRow row{transport_name,
                        threads,
                        metrics,
                        latency.percentile_us(50),
                        latency.percentile_us(99),
                        latency.mean_ns() / 1e3};
        std::cout << fmt::format(
                         "call cost {:>5} thr={} metrics={:<3}  one {}-byte block, submit to "
                         "completion: p50 {:6.2f} us  p99 {:6.2f} us  mean {:6.2f} us\n",
                         row.transport, threads, metrics_mode, kCallCostBytes, row.p50_us,
                         row.p99_us, row.mean_us)
                  << std::flush;
        rows.push_back(row);
      }
    }
  }
  return Status::Ok();
}

// Whether the first and last block of `plan` landed: compared in place for local, through
// the serve child's checksum command for shm.
Status spot_check(const TransferPlan& plan, ServePeer* serve, uint64_t dst_base) {
  const kv::PlanCall first_call = plan.call(0);
  const kv::PlanCall last_call = plan.call(plan.num_calls() - 1);
  const std::pair<uint64_t, uint64_t> blocks[] = {
      {first_call.src[0], first_call.dst[0]},
      {last_call.src[last_call.num_blocks() - 1], last_call.dst[last_call.num_blocks() - 1]}};
  const uint64_t lens[] = {first_call.len[0], last_call.len[last_call.num_blocks() - 1]};
  for (size_t i = 0; i < 2; ++i) {
    const auto [src, dst] = blocks[i];
    const std::span<const std::byte> expected(reinterpret_cast<const std::byte*>(src), lens[i]);
    bool same = false;
    if (serve == nullptr) {
      same = std::memcmp(reinterpret_cast<const void*>(dst), expected.data(), lens[i]) == 0;
    } else {
      KVF_ASSIGN_OR_RETURN(
          std::string reply,
          serve->process.ask(fmt::format("checksum {} {}", dst - dst_base, lens[i]),
                             kChildTimeout));
      same = reply == fmt::format("{:016x}", checksum(expected));
    }
    if (!same) {
      return Internal(
          fmt::format("block at destination {:#x} ({} bytes) did not arrive", dst, lens[i]));
    }
  }
  return Status::Ok();
}

// Everything one (preset, tokens) needs: pools, page lists, the serve child.
struct RequestSetup {
  KvPreset preset;
  uint64_t tokens = 0;
  uint64_t pool_pages = 0;
  uint64_t pool_bytes = 0;
  std::vector<PageIndex> src_pages;
  std::vector<PageIndex> dst_pages;
};

// The all-layers request alone, and followed by the sender's digests and decode's check.
Status measure_integrity(const KvBenchArgs& args, const RequestSetup& request,
                         const TransferPlan& plan, TransferEngine& engine, const PeerHandle& peer,
                         BlockCopier& reference, const KvLayout& dst_layout,
                         uint64_t local_dst_base, const std::string& transport_name, int threads,
                         std::vector<IntegrityRow>& rows) {
  KVF_ASSIGN_OR_RETURN(KvLayout local_layout, pool_layout(request.preset, args.page_size,
                                                          request.pool_pages, local_dst_base));
  reference.run_one_thread();  // the local pool now holds what the destination holds
  Status failure;
  std::vector<std::function<bool()>> contestants = {
      [&] { return execute_once(plan, engine, peer, failure); },
      [&] {
        if (!execute_once(plan, engine, peer, failure)) return false;
        pd::detail::PageDigester digester;
        if (Status s = digester.add_chunk(plan, dst_layout); !s.ok()) {
          failure = s;
          return false;
        }
        if (Status s = pd::detail::verify_pages(digester.result(), local_layout, request.dst_pages,
                                                "bench");
            !s.ok()) {
          failure = s;
          return false;
        }
        return true;
      }};
  std::vector<LatencySampler> samples =
      run_interleaved(interleave_options(args, contestants.size()), contestants);
  KVF_RETURN_IF_ERROR(failure);
  IntegrityRow row;
  row.preset = std::string(request.preset.name);
  row.tokens = request.tokens;
  row.transport = transport_name;
  row.threads = threads;
  row.bytes = plan.total_bytes();
  row.plain_p50_us = samples[0].percentile_us(50);
  row.integrity_p50_us = samples[1].percentile_us(50);
  row.ratio = row.integrity_p50_us / row.plain_p50_us;
  std::cout << fmt::format(
                   "{:<12} {:>6} tok {:>5} thr={} integrity     {:>9}  all_layers p50 {:9.1f} us"
                   "  with digests + verification {:9.1f} us  x plain {:5.2f}\n",
                   row.preset, row.tokens, row.transport, threads, format_bytes(row.bytes),
                   row.plain_p50_us, row.integrity_p50_us, row.ratio)
            << std::flush;
  rows.push_back(row);
  return Status::Ok();
}

Status run_transport(const KvBenchArgs& args, const RequestSetup& request,
                     std::span<const SendStrategy> strategies, const std::string& transport_name,
                     const HostPool& src_pool, const SharedBuffer& local_dst, ServePeer* serve,
                     std::vector<KvRow>& rows, std::vector<IntegrityRow>& integrity_rows) {
  const uint32_t page_size = args.page_size;
  KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(transport_name));
  KVF_ASSIGN_OR_RETURN(KvLayout src_layout,
                       pool_layout(request.preset, page_size, request.pool_pages, src_pool.base()));
  const uint64_t local_dst_base = reinterpret_cast<uint64_t>(local_dst.addr);
  const uint64_t dst_base = serve != nullptr ? serve->addr : local_dst_base;
  KVF_ASSIGN_OR_RETURN(KvLayout dst_layout,
                       pool_layout(request.preset, page_size, request.pool_pages, dst_base));

  std::vector<StrategyPlan> plans;
  for (SendStrategy strategy : strategies) {
    kv::PlanOptions options{.strategy = strategy};
    if (strategy == SendStrategy::kIndexSharded)
      options.max_pages_per_call = args.max_pages_per_call;
    StrategyPlan entry{strategy, {}, 0};
    Status failure;
    LatencySampler build;
    build.run(std::max(1, args.min_time_ms / 4), [&] {
      Result<TransferPlan> plan = kv::build_transfer_plan(src_layout, dst_layout, request.src_pages,
                                                          request.dst_pages, options);
      if (!plan.ok()) {
        failure = plan.status();
        return false;
      }
      entry.plan = std::move(plan).value();
      return true;
    });
    KVF_RETURN_IF_ERROR(failure);
    entry.build_us = build.percentile_us(50);
    plans.push_back(std::move(entry));
  }

  // The reference copies the all-layers blocks (every strategy moves the same bytes) into the
  // local shared pool at the same offsets.
  KVF_ASSIGN_OR_RETURN(
      TransferPlan reference_plan,
      kv::build_transfer_plan(src_layout, dst_layout, request.src_pages, request.dst_pages));
  std::vector<Copy> copies;
  copies.reserve(reference_plan.num_blocks());
  for (size_t c = 0; c < reference_plan.num_calls(); ++c) {
    const kv::PlanCall call = reference_plan.call(c);
    for (size_t b = 0; b < call.num_blocks(); ++b) {
      copies.push_back({static_cast<std::byte*>(local_dst.addr) + (call.dst[b] - dst_base),
                        reinterpret_cast<const std::byte*>(call.src[b]), call.len[b]});
    }
  }
  const uint64_t bytes = reference_plan.total_bytes();

  for (int threads : args.threads) {
    KVF_ASSIGN_OR_RETURN(auto engine,
                         make_engine(threads, args.inline_bytes, args.metrics.back() == "on"));
    KVF_RETURN_IF_ERROR(engine->register_memory(src_pool.data.get(), src_pool.size));
    if (serve == nullptr) {
      KVF_RETURN_IF_ERROR(engine->register_memory(local_dst.addr, local_dst.length));
    }
    KVF_ASSIGN_OR_RETURN(PeerHandle peer,
                         engine->open_peer(serve ? serve->endpoint : engine->endpoint(),
                                           PeerOptions{.transport = transport}));

    // Every strategy and the memcpy references take turns, round after round, so drift on a
    // shared machine hits them alike. The reference is the faster of one thread and
    // `threads` threads, so a split that does not pay off never makes the baseline weak.
    BlockCopier reference(copies, threads);
    Status failure;
    std::vector<std::function<bool()>> contestants;
    for (const StrategyPlan& sp : plans) {
      contestants.push_back(
          [&, plan = &sp.plan] { return execute_once(*plan, *engine, peer, failure); });
    }
    contestants.push_back([&] {
      reference.run_one_thread();
      return true;
    });
    if (threads > 1) {
      contestants.push_back([&] {
        reference.run_all_threads();
        return true;
      });
    }
    std::vector<LatencySampler> samples =
        run_interleaved(interleave_options(args, contestants.size()), contestants);
    KVF_RETURN_IF_ERROR(failure);
    double memcpy_p50_us = samples[plans.size()].percentile_us(50);
    if (threads > 1)
      memcpy_p50_us = std::min(memcpy_p50_us, samples[plans.size() + 1].percentile_us(50));

    std::vector<KvRow> cell;
    std::optional<double> per_layer_p50;
    for (size_t i = 0; i < plans.size(); ++i) {
      const StrategyPlan& sp = plans[i];
      const LatencySampler& latency = samples[i];
      KVF_RETURN_IF_ERROR(spot_check(sp.plan, serve, dst_base));
      KvRow row;
      row.preset = std::string(request.preset.name);
      row.tokens = request.tokens;
      row.strategy = std::string(kv::send_strategy_name(sp.strategy));
      row.transport = transport_name;
      row.threads = threads;
      row.bytes = bytes;
      row.calls = sp.plan.num_calls();
      row.blocks = sp.plan.num_blocks();
      row.plan_build_us = sp.build_us;
      row.plan_bytes = sp.plan.memory_bytes();
      row.p50_us = latency.percentile_us(50);
      row.p99_us = latency.percentile_us(99);
      row.gbps = static_cast<double>(bytes) / (row.p50_us * 1e3);
      if (sp.strategy == SendStrategy::kPerLayer) per_layer_p50 = row.p50_us;
      cell.push_back(row);
    }

    for (KvRow& row : cell) {
      row.memcpy_p50_us = memcpy_p50_us;
      row.time_vs_memcpy = row.p50_us / memcpy_p50_us;
      if (per_layer_p50) row.time_vs_per_layer = row.p50_us / *per_layer_p50;
      std::cout << fmt::format(
                       "{:<12} {:>6} tok {:>5} thr={} {:<13} {:>9} {:>3} calls {:>6} blocks  "
                       "plan {:8.1f} us {:>9}  p50 {:9.1f} us  p99 {:9.1f} us  {:6.2f} GB/s  "
                       "memcpy {:9.1f} us  x memcpy {:5.2f}  x per_layer {}\n",
                       row.preset, row.tokens, row.transport, threads, row.strategy,
                       format_bytes(row.bytes), row.calls, row.blocks, row.plan_build_us,
                       format_bytes(row.plan_bytes), row.p50_us, row.p99_us, row.gbps,
                       row.memcpy_p50_us, row.time_vs_memcpy,
                       row.time_vs_per_layer ? fmt::format("{:5.2f}", *row.time_vs_per_layer)
                                             : std::string("  -"))
                << std::flush;
      rows.push_back(row);
    }
    if (args.integrity) {
      KVF_RETURN_IF_ERROR(measure_integrity(args, request, reference_plan, *engine, peer, reference,
                                            dst_layout, local_dst_base, transport_name, threads,
                                            integrity_rows));
    }
  }
  return Status::Ok();
}

// Transports the bench drives: this engine's own memory (local) or a serve child's pool.
constexpr TransportSet kKvBenchTransports = {TransportKind::kLocal, TransportKind::kShm,
                                             TransportKind::kTcp, TransportKind::kCma,
                                             TransportKind::kUcx};

TransportSet built_transport_kinds() {
  TransportSet built;
  for (const BuiltTransport& t : built_transports()) built.insert(t.kind);
  return built;
}

std::string kv_bench_transport_names(const TransportSet& built) {
  std::string names;
  for (TransportKind kind : kAllTransportKinds) {
    if (!kKvBenchTransports.contains(kind) || !built.contains(kind)) continue;
    names += (names.empty() ? "" : ", ") + std::string(transport_kind_name(kind));
  }
  return names;
}

Status run_grid(const KvBenchArgs& args, std::vector<KvRow>& rows,
                std::vector<CallCostRow>& call_rows, std::vector<IntegrityRow>& integrity_rows) {
  if (args.page_size == 0) return InvalidArgument("--page-size must be > 0, got 0");
  if (args.pool_slack < 1.0) {
    return InvalidArgument(fmt::format("--pool-slack must be >= 1, got {}", args.pool_slack));
  }
  KVF_ASSIGN_OR_RETURN(PagePlacement placement, parse_page_placement(args.pages));
  std::vector<KvPreset> presets;
  for (const std::string& name : args.presets) {
    KVF_ASSIGN_OR_RETURN(KvPreset preset, find_preset(name));
    presets.push_back(preset);
  }
  std::vector<SendStrategy> strategies;
  for (const std::string& name : args.strategies) {
    KVF_ASSIGN_OR_RETURN(SendStrategy strategy, kv::parse_send_strategy(name));
    strategies.push_back(strategy);
  }
  bool any_shm = false;
  const TransportSet built = built_transport_kinds();
  for (const std::string& name : args.transports) {
    KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(name));
    if (!kKvBenchTransports.contains(transport) || !built.contains(transport)) {
      return NotSupported("bench kv: transport " + name + " is not built or not benchable here " +
                          "(valid: " + kv_bench_transport_names(built) + ")");
    }
    any_shm = any_shm || transport != TransportKind::kLocal;
  }
  if (args.inline_bytes == 0) {
    // The engine divides by it when splitting a batch across workers.
    return InvalidArgument("--inline-bytes must be > 0, got 0");
  }
  for (int threads : args.threads) {
    if (threads < 1) return InvalidArgument(fmt::format("--threads must be >= 1, got {}", threads));
  }
  if (args.metrics.empty()) return InvalidArgument("--metrics needs at least one of off, on");
  for (const std::string& mode : args.metrics) {
    if (mode != "off" && mode != "on") {
      return InvalidArgument(fmt::format("--metrics '{}' (valid: off, on)", mode));
    }
  }

  KVF_RETURN_IF_ERROR(measure_call_cost(args, call_rows));

  const double memory_budget = args.max_memory_gib * double(1ull << 30);
  // Source pool, local destination pool, and the serve child's pool.
  const int pools = any_shm ? 3 : 2;
  Progress progress("bench kv", presets.size() * args.tokens.size() * args.transports.size());
  for (const KvPreset& preset : presets) {
    for (uint64_t tokens : args.tokens) {
      RequestSetup request{preset, tokens, 0, 0, {}, {}};
      const uint64_t pages = std::max<uint64_t>(1, (tokens + args.page_size - 1) / args.page_size);
      // Without room for slack, fall back to a pool of exactly the request (random placement
      // is still a random permutation of it) before giving up on the cell.
      for (double slack : {args.pool_slack, 1.0}) {
        request.pool_pages = pool_pages_for(pages, slack, placement);
        KVF_ASSIGN_OR_RETURN(request.pool_bytes,
                             pool_bytes(preset, args.page_size, request.pool_pages));
        if (pools * double(request.pool_bytes) <= memory_budget) break;
      }
      if (pools * double(request.pool_bytes) > memory_budget) {
        std::cout << fmt::format(
            "{:<12} {:>6} tok skipped: {} pools of {} exceed --max-memory-gib "
            "{}\n",
            preset.name, tokens, pools, format_bytes(request.pool_bytes), args.max_memory_gib);
        for (size_t i = 0; i < args.transports.size(); ++i) progress.step();
        continue;
      }
      request.src_pages = place_pages(pages, request.pool_pages, placement, kSrcPlacementSeed);
      request.dst_pages = place_pages(pages, request.pool_pages, placement, kDstPlacementSeed);

      HostPool src_pool(request.pool_bytes);
      // Holds the local destination pool (and keeps it alive across the per-thread engines).
      KVF_ASSIGN_OR_RETURN(auto holder, make_engine(1, args.inline_bytes, false));
      KVF_ASSIGN_OR_RETURN(SharedBuffer local_dst, holder->allocate_shared(request.pool_bytes));
      {
        // Pattern only in the pages the request sends; the rest of the pool is never read.
        KVF_ASSIGN_OR_RETURN(KvLayout src_layout, pool_layout(preset, args.page_size,
                                                              request.pool_pages, src_pool.base()));
        KVF_ASSIGN_OR_RETURN(
            TransferPlan fill_plan,
            kv::build_transfer_plan(src_layout, src_layout, request.src_pages, request.src_pages));
        for (size_t c = 0; c < fill_plan.num_calls(); ++c) {
          const kv::PlanCall call = fill_plan.call(c);
          for (size_t b = 0; b < call.num_blocks(); ++b) {
            const uint64_t offset = call.src[b] - src_pool.base();
            fill_pattern({src_pool.data.get() + offset, call.len[b]}, kPatternSeed, offset);
          }
        }
      }
      // shm and tcp write into the child's allocate_shared pool; cma into a child whose pool
      // is plain memory it registered (what serving stacks register), one child at a time.
      std::unique_ptr<ServePeer> serve;
      bool serve_host_memory = false;
      for (const std::string& transport_name : args.transports) {
        KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(transport_name));
        const bool host_memory = transport == TransportKind::kCma;
        if (serve && serve_host_memory != host_memory) {
          (void)serve->process.ask("quit", std::chrono::seconds(5));
          serve.reset();
        }
        if (transport != TransportKind::kLocal && !serve) {
          std::vector<std::string> extra;
          if (host_memory) extra = {"--memory", args.cma_peer_memory};
          KVF_ASSIGN_OR_RETURN(ServePeer peer,
                               start_serve_peer(self_executable(), request.pool_bytes, extra));
          serve = std::make_unique<ServePeer>(std::move(peer));
          serve_host_memory = host_memory;
        }
        KVF_RETURN_IF_ERROR(run_transport(
            args, request, strategies, transport_name, src_pool, local_dst,
            transport != TransportKind::kLocal ? serve.get() : nullptr, rows, integrity_rows));
        progress.step();
      }
      if (serve) (void)serve->process.ask("quit", std::chrono::seconds(5));
    }
  }
  return Status::Ok();
}

nlohmann::json to_json(const std::vector<KvRow>& rows, const std::vector<CallCostRow>& calls,
                       const std::vector<IntegrityRow>& integrity_rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const IntegrityRow& r : integrity_rows) {
    out.push_back({{"kind", "integrity"},
                   {"preset", r.preset},
                   {"tokens", r.tokens},
                   {"transport", r.transport},
                   {"threads", r.threads},
                   {"bytes", r.bytes},
                   {"plain_p50_us", r.plain_p50_us},
                   {"integrity_p50_us", r.integrity_p50_us},
                   {"time_vs_plain", r.ratio}});
  }
  for (const CallCostRow& r : calls) {
    out.push_back({{"kind", "call_cost"},
                   {"transport", r.transport},
                   {"threads", r.threads},
                   {"metrics", r.metrics},
                   {"block_bytes", kCallCostBytes},
                   {"p50_us", r.p50_us},
                   {"p99_us", r.p99_us},
                   {"mean_us", r.mean_us}});
  }
  for (const KvRow& r : rows) {
    nlohmann::json row = {{"kind", "kv"},
                          {"preset", r.preset},
                          {"tokens", r.tokens},
                          {"strategy", r.strategy},
                          {"transport", r.transport},
                          {"threads", r.threads},
                          {"bytes", r.bytes},
                          {"calls", r.calls},
                          {"blocks", r.blocks},
                          {"plan_build_us", r.plan_build_us},
                          {"plan_bytes", r.plan_bytes},
                          {"p50_us", r.p50_us},
                          {"p99_us", r.p99_us},
                          {"gbps", r.gbps},
                          {"memcpy_p50_us", r.memcpy_p50_us},
                          {"time_vs_memcpy", r.time_vs_memcpy},
                          {"time_vs_per_layer", nullptr}};
    if (r.time_vs_per_layer) row["time_vs_per_layer"] = *r.time_vs_per_layer;
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

void add_bench_kv_command(CLI::App& bench) {
  auto args = std::make_shared<KvBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("kv", "one request's KV transfer per strategy vs memcpy");
  cmd->add_option("--preset", args->presets, "deepseek-v3, llama-3.1-8b, qwen3-235b")
      ->delimiter(',');
  cmd->add_option("--tokens", args->tokens, "context lengths in tokens")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 24));
  cmd->add_option("--page-size", args->page_size, "tokens per page");
  cmd->add_option("--pages", args->pages,
                  "page placement: contiguous, runs:N, freed:N (runs listed last page first), "
                  "random");
  cmd->add_option("--strategy", args->strategies, "all_layers, per_layer, index_sharded")
      ->delimiter(',');
  cmd->add_option("--max-pages-per-call", args->max_pages_per_call,
                  "pages per call for index_sharded");
  cmd->add_option("--transport", args->transports,
                  "built here: " + kv_bench_transport_names(built_transport_kinds()) +
                      " (ucx over UCX's tcp or shared memory: KVFERRY_UCX_ALLOW_EMULATED=1)")
      ->delimiter(',');
  cmd->add_option("--threads", args->threads, "engine worker threads (and memcpy threads)")
      ->delimiter(',');
  cmd->add_option("--cma-peer-memory", args->cma_peer_memory,
                  "the cma peer's pool: host (4 KiB pages) or host-thp (huge pages advised)")
      ->check(CLI::IsMember({"host", "host-thp"}));
  cmd->add_option("--min-time-ms", args->min_time_ms, "measuring time per strategy")
      ->check(CLI::Range(1, 3'600'000));
  cmd->add_option("--min-rounds", args->min_rounds, "calls per strategy at least")
      ->check(CLI::Range(size_t{1}, size_t{100000}));
  cmd->add_option("--pool-slack", args->pool_slack, "pool pages per request page (>= 1)");
  cmd->add_option("--max-memory-gib", args->max_memory_gib,
                  "skip cells whose pools need more memory than this")
      ->check(CLI::Range(0.01, 65536.0));
  cmd->add_option("--inline-bytes", args->inline_bytes,
                  "engine inline_batch_bytes: calls up to this size copy on the caller");
  cmd->add_option("--metrics", args->metrics,
                  "engine metrics for the call-cost engines, each in turn: off, on (e.g. off,on)")
      ->delimiter(',');
  cmd->add_flag("--integrity", args->integrity,
                "also time all_layers with PdIntegrity's sender digests and decode verification, "
                "as a ratio to the same request without");
  cmd->add_option("--json", args->json_path, "write rows as JSON to this file ('-' = stdout)");
  cmd->callback([args] {
    std::vector<KvRow> rows;
    std::vector<CallCostRow> call_rows;
    std::vector<IntegrityRow> integrity_rows;
    Status s = run_grid(*args, rows, call_rows, integrity_rows);
    if (!s.ok()) {
      std::cerr << "kvferry bench kv: " << s.to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (!args->json_path.empty())
      write_json(args->json_path, to_json(rows, call_rows, integrity_rows));
  });
}

}  // namespace kvferry::cli
