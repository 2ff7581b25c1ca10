// `kvferry pd-decode` (hidden): one decode rank for the demo and the integration tests.
// Prints {"ready": true, "endpoint": ENGINE_PEER_NAME, "pid": N}, then reads commands on
// stdin, one reply line each:
//   req ROOM TOKENS BOOTSTRAP  receive a TOKENS-token request from that prefill instance
//                              and verify every page itself
//                              -> done ROOM ok TRANSFER_US PAGES CORRUPT BYTES
//                               | done ROOM failed WHY
//   abort ROOM                 abort it, wait for prefill's ack, then watch its pages
//                              -> aborted ROOM acked|unacked unchanged|changed
//   check ROOM                 how far a request in progress got (fault tests)
//                              -> check ROOM STATE PAGES_ALREADY_CORRECT PAGES | check ROOM unknown
//   quit                       (or end of input) exits
#include <unistd.h>

#include <iostream>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "commands.h"
#include "core/pattern.h"
#include "kvferry/pd/decode_client.h"
#include "pd_model.h"
#include "worker_output.h"

namespace kvferry::cli {
namespace {

// After an abort is acknowledged, the pages are watched this long for late writes.
constexpr auto kAbortWatch = std::chrono::milliseconds(300);

struct Job {
  uint64_t room = 0;
  uint64_t tokens = 0;
  std::vector<kv::PageIndex> pages;
  pd::KvReceiver receiver;
  bool aborted = false;
};

uint64_t pages_checksum(const pd::RankBuffers& b, const std::vector<kv::PageIndex>& pages) {
  uint64_t sum = 0;
  for (const kv::KvEntry& e : b.layout.entries()) {
    for (kv::PageIndex p : pages) {
      sum = sum * 31 +
            checksum({reinterpret_cast<const std::byte*>(e.base + p * e.page_stride), e.item_len});
    }
  }
  return sum;
}

int run_decode(const WorkerArgs& args) {
  auto fail = [](const Status& s) {
    std::cerr << "kvferry pd-decode: " << s.to_string() << "\n";
    return 1;
  };
  Result<ModelPreset> model = find_model(args.model);
  if (!model.ok()) return fail(model.status());
  auto engine = make_worker_engine(args, "decode");
  if (!engine.ok()) return fail(engine.status());
  auto rank =
      setup_rank(**engine, *model, args.page_tokens, args.pool_pages, args.tp_size, args.tp_rank,
                 *parse_pool_memory(args.memory));  // checked by make_worker_engine
  if (!rank.ok()) return fail(rank.status());
  pd::DecodeClientOptions options;
  options.engine = engine->get();
  options.buffers = rank->buffers;
  options.tp = rank->tp;
  options.timeouts = worker_timeouts(args);
  options.integrity.enabled = args.integrity;
  // --corrupt-for-test: flips byte 0 (entry 0) of each request's first page once, when prefill
  // rank 0 reported Success and before its pages are verified. Byte 0 is rank 0's (the first
  // heads when TP differs; the sender of a replicated MLA page), and every byte rank 0 wrote
  // has landed by its Success: flipping it on another rank's report could be overwritten by
  // rank 0's bytes still on the way. Rooms are recorded before init().
  std::mutex corrupt_mu;
  std::map<uint64_t, kv::PageIndex> to_corrupt;
  if (args.corrupt_for_test) {
    options.before_verify_for_test = [&](uint64_t room, uint32_t prefill_rank) {
      if (prefill_rank != 0) return;
      std::lock_guard lock(corrupt_mu);
      auto it = to_corrupt.find(room);
      if (it == to_corrupt.end()) return;
      const kv::KvEntry& e = rank->buffers.layout.entries().front();
      *reinterpret_cast<std::byte*>(e.base + it->second * e.page_stride) ^= std::byte{0x5a};
      to_corrupt.erase(it);
    };
  }
  auto client = pd::DecodeClient::create(options);
  if (!client.ok()) return fail(client.status());
  WorkerOutput out;
  out.line(nlohmann::json{{"ready", true}, {"endpoint", (*engine)->endpoint()}, {"pid", ::getpid()}}
               .dump());

  PageAllocator allocator(args.pool_pages);
  std::mutex mu;
  std::list<std::shared_ptr<Job>> jobs;
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) {
      std::vector<std::shared_ptr<Job>> finished;
      {
        std::lock_guard lock(mu);
        for (auto it = jobs.begin(); it != jobs.end();) {
          if (!(*it)->aborted && pd::is_final((*it)->receiver.poll())) {
            finished.push_back(*it);
            it = jobs.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (auto& job : finished) {
        if (job->receiver.poll() == pd::RequestState::kSuccess) {
          uint64_t corrupt = pd::count_corrupt_pages(rank->buffers.layout, job->pages, job->tokens,
                                                     job->room, rank->heads);
          if (pd::count_corrupt_rows(rank->buffers.aux, job->pages.front(), job->room) != 0 &&
              corrupt == 0) {
            corrupt = 1;  // a wrong aux row counts against the request's first page
          }
          auto us =
              std::chrono::duration_cast<std::chrono::microseconds>(job->receiver.transfer_time())
                  .count();
          allocator.release(job->pages);  // before the reply: the demo reuses them at once
          out.line(fmt::format("done {} ok {} {} {} {}", job->room, us, job->pages.size(), corrupt,
                               job->tokens * rank->bytes_per_token));
        } else {
          allocator.release(job->pages);
          out.line(
              fmt::format("done {} failed {}", job->room, job->receiver.failure().to_string()));
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });

  std::vector<std::thread> abort_watchers;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string verb, bootstrap;
    in >> verb;
    uint64_t room = 0, tokens = 0;
    if (verb == "quit") break;
    if (verb == "req" && (in >> room >> tokens >> bootstrap) && tokens > 0) {
      auto job = std::make_shared<Job>();
      job->room = room;
      job->tokens = tokens;
      auto pages = allocator.allocate((tokens + args.page_tokens - 1) / args.page_tokens);
      auto receiver = (*client)->create_receiver(bootstrap, room);
      Status s = !pages.ok() ? pages.status() : receiver.status();
      if (s.ok() && args.corrupt_for_test) {
        std::lock_guard lock(corrupt_mu);
        to_corrupt[room] = pages->front();
      }
      if (s.ok()) s = receiver->init(*pages, pages->front());
      if (!s.ok()) {
        out.line(fmt::format("done {} failed {}", room, s.to_string()));
        if (pages.ok()) allocator.release(*pages);
        continue;
      }
      job->pages = std::move(*pages);
      job->receiver = std::move(*receiver);
      std::lock_guard lock(mu);
      jobs.push_back(job);
    } else if (verb == "check" && (in >> room)) {
      std::shared_ptr<Job> job;
      {
        std::lock_guard lock(mu);
        for (auto& j : jobs) {
          if (j->room == room) job = j;
        }
      }
      if (!job) {
        out.line(fmt::format("check {} unknown", room));
        continue;
      }
      // Pages may be landing while they are counted: a snapshot, for progress only.
      const uint64_t corrupt = pd::count_corrupt_pages(rank->buffers.layout, job->pages,
                                                       job->tokens, job->room, rank->heads);
      out.line(fmt::format("check {} {} {} {}", room, pd::request_state_name(job->receiver.poll()),
                           job->pages.size() - corrupt, job->pages.size()));
    } else if (verb == "abort" && (in >> room)) {
      std::shared_ptr<Job> job;
      {
        std::lock_guard lock(mu);
        for (auto& j : jobs) {
          if (j->room == room) job = j;
        }
        if (job) job->aborted = true;
      }
      if (!job) {
        out.line(fmt::format("aborted {} unknown", room));
        continue;
      }
      abort_watchers.emplace_back([&, job] {
        job->receiver.abort("abort command");
        bool acked = job->receiver.wait_abort_acked(std::chrono::seconds(10)).ok();
        uint64_t before = pages_checksum(rank->buffers, job->pages);
        std::this_thread::sleep_for(kAbortWatch);
        bool unchanged = before == pages_checksum(rank->buffers, job->pages);
        allocator.release(job->pages);
        out.line(fmt::format("aborted {} {} {}", job->room, acked ? "acked" : "unacked",
                             unchanged ? "unchanged" : "changed"));
      });
    } else {
      out.line("error unknown command: " + line);
    }
  }
  for (auto& t : abort_watchers) t.join();
  stop = true;
  poller.join();
  return 0;
}

}  // namespace

void add_pd_decode_command(CLI::App& app) {
  auto args = std::make_shared<WorkerArgs>();
  CLI::App* cmd = app.add_subcommand("pd-decode", "one decode rank (used by demo and tests)");
  cmd->group("");  // hidden
  add_worker_flags(cmd, *args);
  cmd->callback([args] {
    int rc = run_decode(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
