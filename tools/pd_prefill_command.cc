// `kvferry pd-prefill` (hidden): one prefill rank for the demo and the integration tests.
// Prints {"ready": true, "control": ..., "endpoint": ENGINE_PEER_NAME, "pid": N} once registered
// with the bootstrap server, then reads commands on stdin and answers on stdout, one line each:
//   req ROOM TOKENS   run "chunked prefill" of a TOKENS-token prompt: fill each chunk's
//                     pages with the (room, layer, token) pattern and send it   -> done ROOM ok
//                                                                             | done ROOM failed
//                                                                             WHY
//   quit              (or end of input) exits
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <list>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "commands.h"
#include "core/net.h"
#include "core/thread_pool.h"
#include "kvferry/pd/prefill_server.h"
#include "pd_model.h"
#include "worker_output.h"

namespace kvferry::cli {
namespace {

struct PrefillArgs {
  WorkerArgs worker;
  std::string bootstrap;
  uint32_t chunk_tokens = 256;
  int chunk_delay_ms = 0;  // simulated compute per chunk (fault tests)
};

struct PrefillJob {
  uint64_t room = 0;
  uint64_t tokens = 0;
  std::vector<kv::PageIndex> pages;
  pd::KvSender sender;
  bool started = false;
  std::atomic<bool> compute_done{false};
};

int run_prefill(const PrefillArgs& args) {
  auto fail = [](const Status& s) {
    std::cerr << "kvferry pd-prefill: " << s.to_string() << "\n";
    return 1;
  };
  Result<ModelPreset> model = find_model(args.worker.model);
  if (!model.ok()) return fail(model.status());
  auto engine = make_worker_engine(args.worker, "prefill");
  if (!engine.ok()) return fail(engine.status());
  auto rank = setup_rank(**engine, *model, args.worker.page_tokens, args.worker.pool_pages,
                         args.worker.tp_size, args.worker.tp_rank,
                         *parse_pool_memory(args.worker.memory));  // checked by make_worker_engine
  if (!rank.ok()) return fail(rank.status());
  if (args.chunk_tokens == 0 || args.chunk_tokens % args.worker.page_tokens != 0) {
    return fail(
        InvalidArgument(fmt::format("--chunk-tokens {} is not a positive multiple of "
                                    "--page-tokens {}",
                                    args.chunk_tokens, args.worker.page_tokens)));
  }
  pd::PrefillServerOptions options;
  options.engine = engine->get();
  options.buffers = rank->buffers;
  options.tp = rank->tp;
  options.bootstrap_address = args.bootstrap;
  // Control messages on the engine's host (another host must reach both).
  Result<Endpoint> listen = parse_endpoint(args.worker.listen, true);
  if (!listen.ok()) return fail(listen.status());
  options.control_listen = fmt::format("{}:0", listen->host);
  options.timeouts = worker_timeouts(args.worker);
  options.integrity.enabled = args.worker.integrity;
  auto server = pd::PrefillServer::create(options);
  if (!server.ok()) return fail(server.status());
  WorkerOutput out;
  out.line(nlohmann::json{{"ready", true},
                          {"control", (*server)->control_endpoint()},
                          {"endpoint", (*engine)->endpoint()},
                          {"pid", ::getpid()}}
               .dump());

  PageAllocator allocator(args.worker.pool_pages);
  const uint32_t page_tokens = args.worker.page_tokens;
  ThreadPool compute(2);
  std::mutex mu;
  std::list<std::shared_ptr<PrefillJob>> jobs;
  std::atomic<bool> stop{false};

  // Chunked prefill: each chunk's pages are "computed" (filled) and sent as soon as ready.
  auto prefill = [&](const std::shared_ptr<PrefillJob>& job) {
    struct Done {
      PrefillJob& j;
      ~Done() { j.compute_done = true; }
    } done{*job};
    const size_t pages_per_chunk = args.chunk_tokens / page_tokens;
    std::span<const kv::PageIndex> all(job->pages);
    for (size_t first = 0; first < all.size(); first += pages_per_chunk) {
      const size_t n = std::min(pages_per_chunk, all.size() - first);
      const uint64_t chunk_tokens = std::min<uint64_t>(job->tokens, (first + n) * page_tokens);
      pd::fill_request_pages(rank->buffers.layout, all.first(first + n), chunk_tokens, job->room,
                             rank->heads);
      const bool last = first + n == all.size();
      pd::LastChunkExtras extras;
      if (last) {
        extras.aux_row = job->pages.front();
        pd::fill_rows(rank->buffers.aux, extras.aux_row, job->room);
      }
      if (args.chunk_delay_ms > 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(args.chunk_delay_ms));
      }
      Status s = job->sender.send(all.subspan(first, n), last ? &extras : nullptr);
      if (!s.ok()) {
        job->sender.abort(s.to_string());
        return;
      }
    }
  };

  std::thread poller([&] {
    while (!stop) {
      std::vector<std::shared_ptr<PrefillJob>> finished;
      {
        std::lock_guard lock(mu);
        for (auto it = jobs.begin(); it != jobs.end();) {
          pd::RequestState state = (*it)->sender.poll();
          if (!(*it)->started && state == pd::RequestState::kWaitingForInput) {
            (*it)->started = true;
            auto compute_job = [&prefill, job = *it] { prefill(job); };
            if (!compute.post(compute_job).ok()) compute_job();  // no thread: here
          }
          // A failed job may still be in its compute task: its pages return after it.
          if (pd::is_final(state) && (!(*it)->started || (*it)->compute_done)) {
            finished.push_back(*it);
            it = jobs.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (auto& job : finished) {
        allocator.release(job->pages);  // before the reply: the demo reuses them at once
        if (job->sender.poll() == pd::RequestState::kSuccess) {
          out.line(fmt::format("done {} ok", job->room));
        } else {
          out.line(fmt::format("done {} failed {}", job->room, job->sender.failure().to_string()));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    uint64_t room = 0, tokens = 0;
    if (verb == "quit") break;
    if (verb == "req" && (in >> room >> tokens) && tokens > 0) {
      auto job = std::make_shared<PrefillJob>();
      job->room = room;
      job->tokens = tokens;
      auto pages = allocator.allocate((tokens + page_tokens - 1) / page_tokens);
      auto sender = (*server)->create_sender(room);
      if (!pages.ok() || !sender.ok()) {
        out.line(fmt::format("done {} failed {}", room,
                             (!pages.ok() ? pages.status() : sender.status()).to_string()));
        if (pages.ok()) allocator.release(*pages);
        continue;
      }
      job->pages = std::move(*pages);
      job->sender = std::move(*sender);
      std::lock_guard lock(mu);
      jobs.push_back(job);
    } else {
      out.line("error unknown command: " + line);
    }
  }
  stop = true;
  poller.join();
  // What each transport carried (the demo checks its routes with it).
  out.line(nlohmann::json{{"transport_bytes", transport_bytes(**engine)}}.dump());
  return 0;
}

}  // namespace

void add_pd_prefill_command(CLI::App& app) {
  auto args = std::make_shared<PrefillArgs>();
  CLI::App* cmd = app.add_subcommand("pd-prefill", "one prefill rank (used by demo and tests)");
  cmd->group("");  // hidden
  add_worker_flags(cmd, args->worker);
  cmd->add_option("--bootstrap", args->bootstrap, "bootstrap server host:port")->required();
  cmd->add_option("--chunk-tokens", args->chunk_tokens, "tokens per prefill chunk");
  cmd->add_option("--chunk-delay-ms", args->chunk_delay_ms, "simulated compute per chunk");
  cmd->callback([args] {
    int rc = run_prefill(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
