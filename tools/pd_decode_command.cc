// `kvferry pd-decode` (hidden): one decode rank for the demo and the integration tests.
// Prints {"ready": true, "endpoint": ENGINE_PEER_NAME, "pid": N}, then reads commands on
// stdin, one reply line each:
//   req ROOM TOKENS BOOTSTRAP  receive a TOKENS-token request from that prefill instance
//                              and verify every page itself
//                              -> done ROOM ok TRANSFER_US PAGES CORRUPT BYTES
//                               | done ROOM failed WHY
//   abort ROOM                 abort it, wait for prefill's ack, then reuse its pages at once:
//                              fill them with a watch pattern and watch it for late writes
//                              (300 ms, or --watch-released-ms)
//                              -> aborted ROOM acked|unacked unchanged|changed
// A failed request's pages go back to the pool only once every prefill rank that may still
// write them acknowledged (KvReceiver::wait_abort_acked): a timed-out request is aborted and
// its pages wait for the ack. With --watch-released-ms N they are also filled with the watch
// pattern at the ack and watched for N ms first, and a line reports what was seen:
//                              -> released ROOM unchanged|changed
// A request whose ack never comes keeps its pages out of the pool (with --watch-released-ms:
//                              -> released ROOM unacked).
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
#include "core/net.h"
#include "core/pattern.h"
#include "kvferry/pd/decode_client.h"
#include "pd_model.h"
#include "worker_output.h"

namespace kvferry::cli {
namespace {

// After an abort is acknowledged, the pages are watched this long for late writes.
constexpr auto kAbortWatch = std::chrono::milliseconds(300);
// A failed request whose abort is not acknowledged within this keeps its pages out of the pool.
constexpr auto kAckQuarantine = std::chrono::seconds(20);

struct DecodeJob {
  uint64_t room = 0;
  uint64_t tokens = 0;
  std::vector<kv::PageIndex> pages;
  pd::KvReceiver receiver;
  bool aborted = false;
  // Release path of a failed request: waiting for the abort ack, then watching its pages.
  Clock::time_point failed_at{};
  Clock::time_point watch_until{};
  bool watching = false;
};

// What the next owner of the pages would do at once: overwrite them (here with a pattern
// seeded by the old room, so that a late write of any byte shows).
void fill_watch_pattern(const pd::RankBuffers& b, const DecodeJob& job) {
  uint64_t seed = job.room * 0x9e3779b97f4a7c15ull;
  for (const kv::KvEntry& e : b.layout.entries()) {
    for (kv::PageIndex p : job.pages) {
      fill_pattern({reinterpret_cast<std::byte*>(e.base + p * e.page_stride), e.item_len}, ++seed);
    }
  }
}

// True when every byte still holds fill_watch_pattern's pattern.
bool watch_pattern_intact(const pd::RankBuffers& b, const DecodeJob& job) {
  uint64_t seed = job.room * 0x9e3779b97f4a7c15ull;
  for (const kv::KvEntry& e : b.layout.entries()) {
    for (kv::PageIndex p : job.pages) {
      if (find_pattern_mismatch(
              {reinterpret_cast<const std::byte*>(e.base + p * e.page_stride), e.item_len},
              ++seed)) {
        return false;
      }
    }
  }
  return true;
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
  std::list<std::shared_ptr<DecodeJob>> jobs;
  std::list<std::shared_ptr<DecodeJob>> releasing;  // failed, pages not yet back in the pool
  const auto watch_released = std::chrono::milliseconds(args.watch_released_ms);
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) {
      const auto now = Clock::now();
      for (auto it = releasing.begin(); it != releasing.end();) {
        DecodeJob& job = **it;
        if (!job.watching) {
          if (!job.receiver.wait_abort_acked(std::chrono::milliseconds(0)).ok()) {
            if (now - job.failed_at < kAckQuarantine) {
              ++it;
              continue;
            }
            // The pages stay out of the pool; reported where the caller watches releases.
            if (watch_released.count() > 0) out.line(fmt::format("released {} unacked", job.room));
            it = releasing.erase(it);
            continue;
          }
          if (watch_released.count() == 0) {
            allocator.release(job.pages);
            it = releasing.erase(it);
            continue;
          }
          fill_watch_pattern(rank->buffers, job);
          job.watching = true;
          job.watch_until = now + watch_released;
        }
        if (now < job.watch_until) {
          ++it;
          continue;
        }
        const bool unchanged = watch_pattern_intact(rank->buffers, job);
        allocator.release(job.pages);
        out.line(fmt::format("released {} {}", job.room, unchanged ? "unchanged" : "changed"));
        it = releasing.erase(it);
      }
      std::vector<std::shared_ptr<DecodeJob>> finished;
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
          out.line(
              fmt::format("done {} failed {}", job->room, job->receiver.failure().to_string()));
          job->failed_at = Clock::now();
          releasing.push_back(job);
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
      auto job = std::make_shared<DecodeJob>();
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
      std::shared_ptr<DecodeJob> job;
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
      std::shared_ptr<DecodeJob> job;
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
        fill_watch_pattern(rank->buffers, *job);  // reused the moment the ack came
        std::this_thread::sleep_for(watch_released.count() > 0 ? watch_released : kAbortWatch);
        bool unchanged = watch_pattern_intact(rank->buffers, *job);
        if (acked) allocator.release(job->pages);
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
