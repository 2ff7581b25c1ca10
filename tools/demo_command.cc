// `kvferry demo`: the main job on the PD session layer. Starts a bootstrap server (in this
// process), prefill rank processes (`kvferry pd-prefill`) and decode rank processes
// (`kvferry pd-decode`) on this machine, then routes N requests of random prompt lengths to
// both sides, as a serving stack's router would. Prefill runs chunked prefill, filling each
// chunk's pages with data derived from (request, layer, token) and sending it; decode
// verifies every page it received on its own. Prints a summary (or --json); progress goes
// to stderr.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <vector>

#include "commands.h"
#include "core/child_process.h"
#include "core/net.h"
#include "kvferry/pd/bootstrap.h"
#include "pd_model.h"
#include "serve_client.h"

namespace kvferry::cli {
namespace {

constexpr auto kHelloTimeout = std::chrono::seconds(30);
// read_line rounds its wait down to whole milliseconds: below 2 ms it would never poll.
constexpr auto kPollLine = std::chrono::milliseconds(3);

struct DemoArgs {
  WorkerArgs worker;
  int requests = 64;
  uint32_t min_tokens = 16;
  uint32_t max_tokens = 512;
  uint32_t chunk_tokens = 128;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  uint32_t decode_instances = 1;
  uint64_t seed = 2026;
  int timeout_s = 120;
  bool json = false;
  // Two hosts on one machine (tests: network namespaces): where the bootstrap server and the
  // decode workers listen, and words put in front of each decode worker's command line
  // (e.g. "ip netns exec NS"). Prefill listens on --listen.
  std::string bootstrap_listen = "127.0.0.1:0";
  std::string decode_listen;  // empty: --listen
  std::string decode_launcher;
};

struct DemoSummary {
  int requests = 0, succeeded = 0, failed = 0;
  uint64_t bytes = 0, pages_verified = 0, corrupt_pages = 0;
  double p50_ms = 0, p99_ms = 0, gbps = 0, seconds = 0;
  std::string first_error;
  nlohmann::json transport_bytes = nlohmann::json::object();  // summed over prefill ranks
};

struct Worker {
  ChildProcess process;
  uint32_t instance = 0;  // decode instance (decode workers)
};

struct Request {
  uint64_t room = 0;
  uint32_t tokens = 0;
  uint32_t pages = 0;
  uint32_t instance = 0;
  uint32_t prefill_reports = 0, decode_reports = 0;
  bool ok = true;
  double transfer_ms = 0;
};

std::vector<std::string> split_words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(std::move(word));
  return words;
}

Result<Worker> spawn_worker(const std::vector<std::string>& launcher,
                            const std::vector<std::string>& command, uint32_t instance) {
  std::vector<std::string> argv = launcher;
  argv.insert(argv.end(), command.begin(), command.end());
  KVF_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(argv));
  KVF_ASSIGN_OR_RETURN(std::string hello, child.read_line(kHelloTimeout));
  auto j = nlohmann::json::parse(hello, nullptr, false);
  if (j.is_discarded() || !j.contains("ready")) {
    return ProtocolError(command[1] + " said '" + hello + "', expected its ready line");
  }
  return Worker{std::move(child), instance};
}

std::vector<std::string> worker_argv(const DemoArgs& a, const char* role, uint32_t tp_size,
                                     uint32_t tp_rank, const std::string& listen) {
  std::vector<std::string> argv = {self_executable(), role,
                                   "--model",         a.worker.model,
                                   "--page-tokens",   std::to_string(a.worker.page_tokens),
                                   "--pool-pages",    std::to_string(a.worker.pool_pages),
                                   "--tp-size",       std::to_string(tp_size),
                                   "--tp-rank",       std::to_string(tp_rank),
                                   "--transport",     a.worker.transport,
                                   "--memory",        a.worker.memory,
                                   "--heartbeat-ms",  std::to_string(a.worker.heartbeat_ms),
                                   "--threads",       std::to_string(a.worker.threads),
                                   "--listen",        listen};
  if (a.worker.integrity) argv.emplace_back("--integrity");
  if (a.worker.corrupt_for_test) argv.emplace_back("--corrupt-for-test");
  return argv;
}

Status run_demo(const DemoArgs& args, DemoSummary& out) {
  if (Result<std::optional<TransportKind>> t =
          parse_worker_transport(args.worker.transport, built_transport_set());
      !t.ok()) {
    return Status(t.status().code(), "demo: " + t.status().message());
  }
  KVF_RETURN_IF_ERROR(parse_pool_memory(args.worker.memory).status());
  KVF_ASSIGN_OR_RETURN(ModelPreset model, find_model(args.worker.model));
  const uint32_t page = args.worker.page_tokens;
  // Each count in its range: with no prefill or no decode rank the other side would wait for
  // it until --timeout-s, and every rank is a process of this machine.
  struct Count {
    const char* option;
    int64_t value, most;
  };
  for (const Count& c :
       std::initializer_list<Count>{{"--requests", args.requests, 1 << 20},
                                    {"--page-tokens", page, 1 << 20},
                                    {"--min-tokens", args.min_tokens, 1 << 24},
                                    {"--prefill-tp", args.prefill_tp, 64},
                                    {"--decode-tp", args.decode_tp, 64},
                                    {"--decode-instances", args.decode_instances, 64},
                                    {"--timeout-s", args.timeout_s, 86400}}) {
    if (c.value < 1 || c.value > c.most) {
      return InvalidArgument(fmt::format("demo: {} {} (valid: 1..{})", c.option, c.value, c.most));
    }
  }
  if (args.min_tokens > args.max_tokens) {
    return InvalidArgument(fmt::format("demo: --min-tokens {} is more than --max-tokens {}",
                                       args.min_tokens, args.max_tokens));
  }
  const uint32_t max_pages = (args.max_tokens + page - 1) / page;
  if (max_pages > args.worker.pool_pages) {
    return InvalidArgument(fmt::format("demo: a {}-token prompt needs {} pages, the pool has {}",
                                       args.max_tokens, max_pages, args.worker.pool_pages));
  }
  pd::BootstrapServerOptions bootstrap_options;
  bootstrap_options.listen_address = args.bootstrap_listen;
  bootstrap_options.rank_stale_after = std::chrono::milliseconds(args.worker.heartbeat_ms * 3);
  KVF_ASSIGN_OR_RETURN(auto bootstrap, pd::BootstrapServer::start(bootstrap_options));
  std::cerr << fmt::format(
      "demo: {} ({}), prefill tp {}, decode tp {} x {} instance(s), {} pages of {} tokens "
      "per rank, bootstrap {}\n",
      model.name, model.kind == ModelKind::kMla ? "MLA" : "MHA", args.prefill_tp, args.decode_tp,
      args.decode_instances, args.worker.pool_pages, page, bootstrap->address());

  const std::string decode_listen =
      args.decode_listen.empty() ? args.worker.listen : args.decode_listen;
  std::vector<Worker> prefills, decodes;
  for (uint32_t r = 0; r < args.prefill_tp; ++r) {
    auto argv = worker_argv(args, "pd-prefill", args.prefill_tp, r, args.worker.listen);
    argv.insert(argv.end(), {"--bootstrap", bootstrap->address(), "--chunk-tokens",
                             std::to_string(args.chunk_tokens)});
    KVF_ASSIGN_OR_RETURN(Worker w, spawn_worker({}, argv, 0));
    prefills.push_back(std::move(w));
  }
  for (uint32_t i = 0; i < args.decode_instances; ++i) {
    for (uint32_t r = 0; r < args.decode_tp; ++r) {
      KVF_ASSIGN_OR_RETURN(
          Worker w,
          spawn_worker(split_words(args.decode_launcher),
                       worker_argv(args, "pd-decode", args.decode_tp, r, decode_listen), i));
      decodes.push_back(std::move(w));
    }
  }

  std::mt19937_64 rng(args.seed);
  std::uniform_int_distribution<uint32_t> length(args.min_tokens, args.max_tokens);
  std::map<uint64_t, Request> requests;
  std::deque<uint64_t> queue;
  for (int i = 0; i < args.requests; ++i) {
    Request r;
    r.room = static_cast<uint64_t>(i) + 1;
    r.tokens = length(rng);
    r.pages = (r.tokens + page - 1) / page;
    r.instance = static_cast<uint32_t>(i) % args.decode_instances;
    requests[r.room] = r;
    queue.push_back(r.room);
  }
  uint32_t prefill_free = args.worker.pool_pages;
  std::vector<uint32_t> decode_free(args.decode_instances, args.worker.pool_pages);
  std::vector<double> latencies_ms;
  int finished = 0, next_progress = 0;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::seconds(args.timeout_s);

  auto finish_request = [&](Request& r) {
    ++finished;
    decode_free[r.instance] += r.pages;
    if (r.ok) {
      ++out.succeeded;
      latencies_ms.push_back(r.transfer_ms);
    } else {
      ++out.failed;
    }
  };
  auto handle_line = [&](const std::string& line, bool from_prefill) -> Status {
    std::istringstream in(line);
    std::string verb, result;
    uint64_t room = 0;
    in >> verb >> room >> result;
    auto it = requests.find(room);
    if (verb != "done" || it == requests.end()) {
      return ProtocolError("demo: unexpected worker line '" + line + "'");
    }
    Request& r = it->second;
    if (result != "ok") {
      r.ok = false;
      if (out.first_error.empty()) out.first_error = line;
    }
    if (from_prefill) {
      if (++r.prefill_reports == args.prefill_tp) prefill_free += r.pages;
      return Status::Ok();
    }
    if (result == "ok") {
      uint64_t us = 0, pages = 0, corrupt = 0, bytes = 0;
      in >> us >> pages >> corrupt >> bytes;
      r.transfer_ms = std::max(r.transfer_ms, us / 1000.0);
      out.pages_verified += pages;
      out.corrupt_pages += corrupt;
      out.bytes += bytes;
    }
    if (++r.decode_reports == args.decode_tp) finish_request(r);
    return Status::Ok();
  };

  while (finished < args.requests) {
    while (!queue.empty()) {
      Request& r = requests[queue.front()];
      if (r.pages > prefill_free || r.pages > decode_free[r.instance]) break;
      prefill_free -= r.pages;
      decode_free[r.instance] -= r.pages;
      queue.pop_front();
      for (Worker& d : decodes) {
        if (d.instance != r.instance) continue;
        KVF_RETURN_IF_ERROR(d.process.send_line(
            fmt::format("req {} {} {}", r.room, r.tokens, bootstrap->address())));
      }
      for (Worker& p : prefills) {
        KVF_RETURN_IF_ERROR(p.process.send_line(fmt::format("req {} {}", r.room, r.tokens)));
      }
    }
    for (auto* group : {&prefills, &decodes}) {
      for (Worker& w : *group) {
        for (;;) {
          Result<std::string> line = w.process.read_line(kPollLine);
          if (!line.ok()) {
            if (line.status().code() == StatusCode::kTimeout) break;
            return Status(line.status().code(),
                          "demo: a worker exited: " + line.status().message());
          }
          KVF_RETURN_IF_ERROR(handle_line(*line, group == &prefills));
        }
      }
    }
    if (finished >= next_progress) {
      std::cerr << fmt::format("demo: {}/{} requests done ({} failed)\n", finished, args.requests,
                               out.failed);
      next_progress = finished + std::max(1, args.requests / 8);
    }
    if (Clock::now() > deadline) {
      return Timeout(fmt::format("demo: {} of {} requests unfinished after {} s",
                                 args.requests - finished, args.requests, args.timeout_s));
    }
  }
  out.requests = args.requests;
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(latencies_ms.begin(), latencies_ms.end());
  auto pct = [&](double p) {
    if (latencies_ms.empty()) return 0.0;
    return latencies_ms[std::min(latencies_ms.size() - 1,
                                 static_cast<size_t>(p / 100 * latencies_ms.size()))];
  };
  out.p50_ms = pct(50);
  out.p99_ms = pct(99);
  out.gbps = out.bytes / out.seconds / 1e9;
  for (auto* group : {&prefills, &decodes}) {
    for (Worker& w : *group) w.process.send_line("quit").ignore();
  }
  // Each prefill rank's last line: the bytes each transport carried.
  for (Worker& w : prefills) {
    for (int i = 0; i < 1000; ++i) {
      Result<std::string> line = w.process.read_line(std::chrono::seconds(10));
      if (!line.ok()) break;
      auto j = nlohmann::json::parse(*line, nullptr, false);
      if (j.is_discarded() || !j.contains("transport_bytes")) continue;
      for (const auto& [name, bytes] : j["transport_bytes"].items()) {
        out.transport_bytes[name] =
            out.transport_bytes.value(name, uint64_t{0}) + bytes.get<uint64_t>();
      }
      break;
    }
  }
  for (auto* group : {&prefills, &decodes}) {
    for (Worker& w : *group) w.process.finish(std::chrono::seconds(10)).status().ignore();
  }
  return Status::Ok();
}

void print_summary(const DemoArgs& args, const DemoSummary& s) {
  if (args.json) {
    std::cout << nlohmann::json{{"requests", s.requests},
                                {"succeeded", s.succeeded},
                                {"failed", s.failed},
                                {"bytes", s.bytes},
                                {"pages_verified", s.pages_verified},
                                {"corrupt_pages", s.corrupt_pages},
                                {"p50_ms", s.p50_ms},
                                {"p99_ms", s.p99_ms},
                                {"gbps", s.gbps},
                                {"seconds", s.seconds},
                                {"first_error", s.first_error},
                                {"transport_bytes", s.transport_bytes}}
                     .dump()
              << std::endl;
    return;
  }
  std::cout << fmt::format(
      "kvferry demo summary ({}, prefill tp {}, decode tp {})\n"
      "  requests        {} ({} succeeded, {} failed)\n"
      "  bytes moved     {} ({:.1f} MiB)\n"
      "  pages verified  {} by the decode processes, {} corrupt\n"
      "  latency/request p50 {:.3f} ms, p99 {:.3f} ms (TransferRequest sent -> Success)\n"
      "  throughput      {:.2f} GB/s over {:.2f} s\n",
      args.worker.model, args.prefill_tp, args.decode_tp, s.requests, s.succeeded, s.failed,
      s.bytes, s.bytes / 1048576.0, s.pages_verified, s.corrupt_pages, s.p50_ms, s.p99_ms, s.gbps,
      s.seconds);
  std::string carried;
  for (const auto& [name, bytes] : s.transport_bytes.items()) {
    carried += fmt::format("{}{} {}", carried.empty() ? "" : ", ", name, bytes.get<uint64_t>());
  }
  std::cout << "  bytes by route  " << (carried.empty() ? "none" : carried) << " (--transport "
            << args.worker.transport << ", --memory " << args.worker.memory << ")\n";
  if (!s.first_error.empty()) std::cout << "  first error     " << s.first_error << "\n";
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto args = std::make_shared<DemoArgs>();
  CLI::App* cmd = app.add_subcommand(
      "demo", "PD demo: bootstrap + prefill + decode processes, chunked prefill, verified pages");
  add_worker_flags(cmd, args->worker);
  cmd->add_option("--requests", args->requests, "number of requests");
  cmd->add_option("--min-tokens", args->min_tokens, "shortest prompt");
  cmd->add_option("--max-tokens", args->max_tokens, "longest prompt");
  cmd->add_option("--chunk-tokens", args->chunk_tokens, "tokens per prefill chunk");
  cmd->add_option("--prefill-tp", args->prefill_tp, "prefill ranks (processes)");
  cmd->add_option("--decode-tp", args->decode_tp, "decode ranks per decode instance");
  cmd->add_option("--decode-instances", args->decode_instances, "decode instances");
  cmd->add_option("--seed", args->seed, "seed for prompt lengths");
  cmd->add_option("--timeout-s", args->timeout_s, "give up after this long");
  cmd->add_flag("--json", args->json, "print the summary as one JSON object");
  cmd->add_option("--bootstrap-listen", args->bootstrap_listen,
                  "bootstrap server listen address host:port");
  cmd->add_option("--decode-listen", args->decode_listen,
                  "decode workers' handshake listener host:port (default: --listen)");
  cmd->add_option("--decode-launcher", args->decode_launcher,
                  "words put in front of each decode worker's command, e.g. \"ip netns exec NS\"");
  cmd->callback([args] {
    DemoSummary s;
    Status status = run_demo(*args, s);
    if (!status.ok()) {
      std::cerr << "kvferry demo: " << status.to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    print_summary(*args, s);
    if (s.failed != 0 || s.corrupt_pages != 0) throw CLI::RuntimeError(3);
  });
}

}  // namespace kvferry::cli
