// `kvferry demo`: the main job. A prefill process (this one) moves KV pages into a decode
// process (`kvferry serve`, a child) through the engine, one batch per request, with the
// destination pages scattered at random as a paged KV pool would have them. Every page
// carries data derived from its destination position, so decode verifies every byte on
// its own. Prints a summary (or --json).
//
// Until the PD session layer lands this drives the engine directly: requests are page
// lists, not prompts.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <vector>

#include "bench_util.h"
#include "commands.h"
#include "core/net.h"
#include "core/pattern.h"
#include "kvferry/transfer_engine.h"
#include "serve_client.h"

namespace kvferry::cli {
namespace {

struct DemoArgs {
  int requests = 64;
  uint64_t page_bytes = 64 * 1152;  // deepseek-v3 MLA: 64 tokens x 1152 bytes, one layer
  int layers = 8;                   // page-major: one page holds every layer's slice
  int pool_pages = 1024;
  uint64_t seed = 2026;
  int threads = 2;
  std::string transport = "shm";
  bool json = false;
};

struct DemoSummary {
  int requests = 0, succeeded = 0, failed = 0;
  uint64_t bytes = 0, pages_verified = 0, corrupt_pages = 0;
  double p50_ms = 0, p99_ms = 0, gbps = 0, seconds = 0;
  std::string first_error;
};

Status run_demo(const DemoArgs& args, DemoSummary& out) {
  KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(args.transport));
  if (transport != TransportKind::kShm) {
    return NotSupported("demo: transport " + args.transport + " is not built yet (valid: shm)");
  }
  if (args.requests <= 0 || args.pool_pages < args.requests || args.layers <= 0) {
    return InvalidArgument(
        fmt::format("demo: need requests > 0, layers > 0 and pool_pages >= requests "
                    "(got {}, {}, {})",
                    args.requests, args.layers, args.pool_pages));
  }
  const uint64_t page = args.page_bytes * args.layers;
  const uint64_t pool_bytes = page * args.pool_pages;
  std::cerr << fmt::format("demo: decode pool {} pages x {} = {}, {} requests\n", args.pool_pages,
                           format_bytes(page), format_bytes(pool_bytes), args.requests);
  KVF_ASSIGN_OR_RETURN(ServePeer decode,
                       start_serve_peer(self_executable(), pool_bytes, {"--name", "decode"}));
  EngineOptions options;
  options.name = "prefill";
  options.worker_threads = args.threads;
  KVF_ASSIGN_OR_RETURN(auto engine, TransferEngine::create(options));
  PeerOptions peer_options;
  peer_options.transport = transport;
  KVF_ASSIGN_OR_RETURN(PeerHandle peer, engine->open_peer(decode.endpoint, peer_options));

  // Every decode page is written by exactly one request: a random permutation of the
  // pool, cut into requests of random length.
  std::mt19937_64 rng(args.seed);
  std::vector<uint64_t> dst_pages(args.pool_pages);
  std::iota(dst_pages.begin(), dst_pages.end(), 0);
  std::shuffle(dst_pages.begin(), dst_pages.end(), rng);
  std::vector<int> cuts = {0, args.pool_pages};
  std::uniform_int_distribution<int> cut(1, args.pool_pages - 1);
  while (static_cast<int>(cuts.size()) < args.requests + 1) {
    int c = cut(rng);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());

  // Prefill's own KV: page i of the source holds what decode page dst_pages[i] must hold.
  std::vector<std::byte> src(pool_bytes);
  for (int i = 0; i < args.pool_pages; ++i) {
    fill_pattern({src.data() + i * page, page}, args.seed, dst_pages[i] * page);
  }
  KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));

  std::vector<double> latencies_ms;
  auto start = Clock::now();
  for (int r = 0; r < args.requests; ++r) {
    std::vector<TransferOp> ops;
    for (int i = cuts[r]; i < cuts[r + 1]; ++i) {
      ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data() + i * page),
                     decode.addr + dst_pages[i] * page, page});
    }
    auto t0 = Clock::now();
    Status s = engine->transfer_sync(peer, ops);
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ++out.requests;
    if (s.ok()) {
      ++out.succeeded;
      out.bytes += ops.size() * page;
    } else {
      ++out.failed;
      if (out.first_error.empty()) out.first_error = s.to_string();
    }
    if ((r + 1) % std::max(1, args.requests / 4) == 0 || r + 1 == args.requests) {
      std::cerr << fmt::format("demo: {}/{} requests sent\n", r + 1, args.requests);
    }
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    return latencies_ms[std::min(latencies_ms.size() - 1,
                                 static_cast<size_t>(p / 100 * latencies_ms.size()))];
  };
  out.p50_ms = pct(50);
  out.p99_ms = pct(99);
  out.gbps = out.bytes / out.seconds / 1e9;

  // Decode checks every page on its own.
  KVF_ASSIGN_OR_RETURN(std::string reply,
                       decode.process.ask(fmt::format("verify-pages {} {}", args.seed, page),
                                          std::chrono::seconds(120)));
  std::istringstream in(reply);
  std::string ok;
  in >> ok >> out.pages_verified >> out.corrupt_pages;
  if (ok != "ok") return Internal("decode could not verify: " + reply);
  return Status::Ok();
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "prefill -> decode KV page transfer between two processes, verified");
  cmd->add_option("--requests", args->requests, "number of requests");
  cmd->add_option("--page-bytes", args->page_bytes, "bytes of one page of one layer");
  cmd->add_option("--layers", args->layers, "layers per page (page-major layout)");
  cmd->add_option("--pool-pages", args->pool_pages, "pages in decode's KV pool");
  cmd->add_option("--seed", args->seed, "seed for page data and page placement");
  cmd->add_option("--threads", args->threads, "engine worker threads");
  cmd->add_option("--transport", args->transport, "shm");
  cmd->add_flag("--json", args->json, "print the summary as one JSON object");
  cmd->callback([args] {
    DemoSummary s;
    Status status = run_demo(*args, s);
    if (!status.ok()) {
      std::cerr << "kvferry demo: " << status.to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (args->json) {
      std::cout << nlohmann::json{{"requests", s.requests},
                                  {"succeeded", s.succeeded},
                                  {"failed", s.failed},
                                  {"bytes", s.bytes},
                                  {"pages_verified", s.pages_verified},
                                  {"corrupt_pages", s.corrupt_pages},
                                  {"p50_ms", s.p50_ms},
                                  {"p99_ms", s.p99_ms},
                                  {"gbps", s.gbps},
                                  {"first_error", s.first_error}}
                       .dump()
                << "\n";
    } else {
      std::cout << fmt::format(
          "kvferry demo summary\n"
          "  requests        {} ({} succeeded, {} failed)\n"
          "  bytes moved     {} ({:.1f} MiB)\n"
          "  pages verified  {} by the decode process, {} corrupt\n"
          "  latency/request p50 {:.3f} ms, p99 {:.3f} ms\n"
          "  throughput      {:.2f} GB/s\n",
          s.requests, s.succeeded, s.failed, s.bytes, s.bytes / 1048576.0, s.pages_verified,
          s.corrupt_pages, s.p50_ms, s.p99_ms, s.gbps);
      if (!s.first_error.empty()) std::cout << "  first error     " << s.first_error << "\n";
    }
    if (s.failed != 0 || s.corrupt_pages != 0) throw CLI::RuntimeError(3);
  });
}

}  // namespace kvferry::cli
