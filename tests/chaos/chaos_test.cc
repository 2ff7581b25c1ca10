// Chaos: two prefill and two decode processes in their own network namespaces over tcp,
// on impaired links, with metadata in etcd, under a steady load of requests of random
// lengths (chunked prefill, integrity on), while faults are injected at random moments:
// kill -9 + restart of a decode and of a prefill, SIGSTOP/SIGCONT of one, kill -9 + restart
// of etcd with its data lost, a link dropped for a few seconds (nftables).
//
// What must hold (each checked, the test fails otherwise):
//  * every request ends within its deadline, on both sides: Success with every page
//    verified (digests and decode's own pattern check) or Failed with a typed reason; a
//    side whose process the test killed is excused; nothing hangs;
//  * no Success has a wrong page, no DataCorrupted, and no page decode gave up was written
//    afterwards (pd-decode --watch-released-ms reports "released ROOM changed");
//  * after each fault new requests through the affected process succeed (no sticky failed
//    session), and after etcd returns every live engine's record is back in it;
//  * open fds, threads and RSS of the processes never killed stop growing;
//  * every kind of fault was injected at least once.
// Prints a summary: requests, faults by kind, outcomes by reason, p50/p99 latency.
//
// KVFERRY_CHAOS_SECONDS (default 90) sets the time under load, KVFERRY_CHAOS_SEED the
// random seed (default: from the clock; printed). scripts/soak.sh runs it for longer.
// Needs root (namespaces, nftables); skipped with the reason otherwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>
#include <random>
#include <sstream>

#include "chaos/chaos_cluster.h"

namespace kvferry::testing {
namespace {

enum class Fault : uint8_t { kKillDecode, kKillPrefill, kStopOne, kRestartEtcd, kDropLink };
constexpr std::array<Fault, 5> kAllFaults = {Fault::kKillDecode, Fault::kKillPrefill,
                                             Fault::kStopOne, Fault::kRestartEtcd,
                                             Fault::kDropLink};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::kKillDecode: return "kill -9 + restart decode";
    case Fault::kKillPrefill: return "kill -9 + restart prefill";
    case Fault::kStopOne: return "SIGSTOP/SIGCONT";
    case Fault::kRestartEtcd: return "kill -9 + restart etcd (data lost)";
    case Fault::kDropLink: return "link dropped (nftables)";
  }
  return "?";
}

constexpr auto kFaultHold = 2500ms;     // how long a process stays stopped / a link dropped
constexpr auto kEtcdDown = 2000ms;      // etcd down before it is started again
constexpr auto kRecoveryTimeout = 40s;  // a fault's affected process must succeed again within
constexpr int kRecoveredAfter = 3;      // ... this many new requests
constexpr auto kRequestDeadline = 30s;  // > bootstrap 5 s + transfer 10 s + a fault hold + slack
constexpr int kMaxInFlight = 16;
constexpr uint32_t kMaxTokens = 1024;
// The processes never killed must not grow between the middle and the end of the load by
// more than this (a per-request leak of one fd or thread would add thousands).
constexpr uint64_t kFdSlack = 24, kThreadSlack = 8, kRssSlackKib = 64 * 1024;

enum class Outcome : uint8_t { kPending, kSuccess, kFailed, kExcused };

struct Side {
  Outcome outcome = Outcome::kPending;
  std::string reason;  // the status code name when Failed
};

struct Request {
  uint64_t room = 0;
  uint32_t tokens = 0;
  int prefill = 0, decode = 0;  // slots
  int prefill_generation = 0, decode_generation = 0;
  std::chrono::steady_clock::time_point submitted;
  Side decode_side, prefill_side;
  bool settled = false;
};

bool typed_reason(const std::string& code) {
  for (uint8_t c = 1; c <= static_cast<uint8_t>(kLastStatusCode); ++c) {
    const auto status_code = static_cast<StatusCode>(c);
    if (status_code == StatusCode::kInternal) continue;  // "a system call failed": not a reason
    if (code == status_code_name(status_code)) return true;
  }
  return false;
}

std::string code_of(const std::string& why) { return why.substr(0, why.find(':')); }

class Chaos : public ::testing::Test {
 protected:
  using Steady = std::chrono::steady_clock;

  void SetUp() override {
    if (std::string why = netns_unavailable(); !why.empty()) GTEST_SKIP() << why;
    for (const char* tool :
         {"/usr/sbin/nft", "/usr/bin/etcd", "/usr/bin/etcdctl", "/usr/bin/curl"}) {
      if (::access(tool, X_OK) != 0) GTEST_SKIP() << tool << " is not installed (scripts/setup.sh)";
    }
    const char* seconds = std::getenv("KVFERRY_CHAOS_SECONDS");
    load_for_ = std::chrono::seconds(seconds != nullptr ? std::max(30, std::atoi(seconds)) : 90);
    const char* seed = std::getenv("KVFERRY_CHAOS_SEED");
    seed_ = seed != nullptr ? std::strtoull(seed, nullptr, 10)
                            : static_cast<uint64_t>(Steady::now().time_since_epoch().count());
    rng_.seed(seed_);
    fault_rng_.seed(seed_ + 1);  // the fault plan does not depend on how the load went
    cluster_.emplace(/*integrity=*/true);
    if (std::string why = cluster_->start(); !why.empty()) {
      if (why.rfind("cannot", 0) == 0) GTEST_SKIP() << why;
      FAIL() << why;
    }
  }

  void TearDown() override {
    if (HasFailure() && cluster_) {
      const std::string dir = fmt::format("/tmp/kvferry-chaos-{}-{}", seed_, ::getpid());
      cluster_->keep_logs(dir);
      std::cout << "[chaos] logs kept in " << dir << std::endl;
    }
  }

  // --- load --------------------------------------------------------------------------------
  void submit_some() {
    while (pending_ < kMaxInFlight) {
      std::vector<int> prefills, decodes;
      for (int slot = 0; slot < kWorkers; ++slot) {
        if (!cluster_->worker(slot).up) continue;
        (slot < 2 ? prefills : decodes).push_back(slot);
      }
      if (prefills.empty() || decodes.empty()) return;
      Request r;
      r.room = next_room_++;
      r.tokens = std::uniform_int_distribution<uint32_t>(1, kMaxTokens)(rng_);
      r.prefill = prefills[rng_() % prefills.size()];
      r.decode = decodes[rng_() % decodes.size()];
      auto& p = cluster_->worker(r.prefill);
      auto& d = cluster_->worker(r.decode);
      r.prefill_generation = p.generation;
      r.decode_generation = d.generation;
      r.submitted = Steady::now();
      if (!cluster_->send(d, fmt::format("req {} {} {}", r.room, r.tokens,
                                         cluster_->bootstrap_address(p.index)))) {
        r.decode_side.outcome = Outcome::kExcused;
      }
      if (!cluster_->send(p, fmt::format("req {} {}", r.room, r.tokens))) {
        r.prefill_side.outcome = Outcome::kExcused;
      }
      ++pending_;
      requests_.emplace(r.room, r);
      settle_if_done(requests_.at(r.room));
    }
  }

  void settle_if_done(Request& r) {
    if (r.decode_side.outcome == Outcome::kPending || r.prefill_side.outcome == Outcome::kPending) {
      return;
    }
    if (r.settled) return;
    --pending_;
    r.settled = true;
  }

  void on_event(const WorkerEvent& e) {
    auto& w = cluster_->worker(e.slot);
    if (e.closed) {
      if (e.generation == w.generation && w.up) {
        ADD_FAILURE() << w.ns.name() << " exited by itself\n" << cluster_->log_of(w);
        w.up = false;
      }
      return;
    }
    std::istringstream in(e.line);
    std::string verb, result;
    uint64_t room = 0;
    in >> verb >> room >> result;
    auto it = requests_.find(room);
    if (verb == "released") {
      ++released_[result];
      if (result == "changed") {
        ADD_FAILURE() << w.ns.name() << ": room " << room
                      << " pages were written after decode gave them up";
      }
      return;
    }
    if (verb != "done" || it == requests_.end()) {
      ADD_FAILURE() << w.ns.name() << " printed an unexpected line: " << e.line;
      return;
    }
    Request& r = it->second;
    const bool is_decode = e.slot >= 2;
    if ((is_decode ? r.decode_generation : r.prefill_generation) != e.generation) return;
    Side& side = is_decode ? r.decode_side : r.prefill_side;
    if (side.outcome != Outcome::kPending && side.outcome != Outcome::kExcused) {
      ADD_FAILURE() << "room " << room << " finished twice: " << e.line;
      return;
    }
    if (result == "ok") {
      side.outcome = Outcome::kSuccess;
      if (is_decode) {
        uint64_t us = 0, pages = 0, corrupt = 0, bytes = 0;
        in >> us >> pages >> corrupt >> bytes;
        EXPECT_EQ(corrupt, 0u) << "Success with a wrong page: " << e.line;
        EXPECT_EQ(pages, (r.tokens + kPageTokens - 1) / kPageTokens) << e.line;
        EXPECT_EQ(bytes, r.tokens * kBytesPerToken) << e.line;
        latencies_ms_.push_back(
            std::chrono::duration<double, std::milli>(Steady::now() - r.submitted).count());
        ++successes_since_[r.decode];
        ++successes_since_[r.prefill];
        if (r.submitted >= recovery_since_) {
          ++recovered_[r.decode];
          ++recovered_[r.prefill];
          ++recovered_any_;
        }
      }
    } else {
      std::string why;
      std::getline(in, why);
      why.erase(0, why.find_first_not_of(' '));
      side.outcome = Outcome::kFailed;
      side.reason = code_of(why);
      last_failures_[e.slot] = fmt::format("room {}: {}", room, why);
      EXPECT_TRUE(typed_reason(side.reason)) << "untyped failure: " << e.line;
      EXPECT_NE(side.reason, "DataCorrupted") << "a page arrived wrong: " << e.line;
    }
    settle_if_done(r);
  }

  // A killed process's requests are excused on its side (nothing can report them).
  void excuse(int slot, int generation) {
    for (auto& [room, r] : requests_) {
      Side& side = slot >= 2 ? r.decode_side : r.prefill_side;
      const int g = slot >= 2 ? r.decode_generation : r.prefill_generation;
      const int s = slot >= 2 ? r.decode : r.prefill;
      if (s == slot && g == generation && side.outcome == Outcome::kPending) {
        side.outcome = Outcome::kExcused;
        ++excused_;
        settle_if_done(r);
      }
    }
  }

  void check_deadlines() {
    const auto now = Steady::now();
    for (auto& [room, r] : requests_) {
      if (r.settled || now - r.submitted < kRequestDeadline) continue;
      for (auto [side, name] :
           {std::pair{&r.decode_side, "decode"}, {&r.prefill_side, "prefill"}}) {
        if (side->outcome == Outcome::kPending) {
          ADD_FAILURE() << "room " << room << " (" << r.tokens << " tokens) hangs on " << name
                        << ": no outcome " << kRequestDeadline.count() << " s after it was sent";
          side->outcome = Outcome::kExcused;
          ++hangs_;
        }
      }
      settle_if_done(r);
    }
  }

  // Runs the load for `d`, processing events, while `until` (if any) is false.
  template <typename Done>
  bool pump_until(std::chrono::milliseconds d, Done done) {
    const auto end = Steady::now() + d;
    while (Steady::now() < end) {
      submit_some();
      while (auto e = cluster_->next_event(5ms)) on_event(*e);
      check_deadlines();
      if (done()) return true;
    }
    return false;
  }
  void pump(std::chrono::milliseconds d) {
    pump_until(d, [] { return false; });
  }

  // --- faults -------------------------------------------------------------------------------
  void inject(Fault f) {
    ++faults_[f];
    int affected = -1;
    std::cout << fmt::format("[chaos] t={:.1f}s {}", seconds_since_start(), fault_name(f))
              << std::flush;
    switch (f) {
      case Fault::kKillDecode:
      case Fault::kKillPrefill: {
        // Slot 0 of each role dies; slot 1 survives the whole run (its footprint is checked).
        affected = f == Fault::kKillDecode ? 2 : 0;
        auto& w = cluster_->worker(affected);
        const int generation = w.generation;
        const bool restarted = cluster_->kill_and_restart(w);
        excuse(affected, generation);
        ASSERT_TRUE(restarted) << w.ns.name() << " did not restart";
        break;
      }
      case Fault::kStopOne: {
        affected = static_cast<int>(fault_rng_() % kWorkers);
        cluster_->signal(cluster_->worker(affected), SIGSTOP);
        pump(kFaultHold);
        cluster_->signal(cluster_->worker(affected), SIGCONT);
        break;
      }
      case Fault::kDropLink: {
        affected = static_cast<int>(fault_rng_() % kWorkers);
        ASSERT_TRUE(cluster_->drop_link(cluster_->worker(affected), true));
        pump(kFaultHold);
        ASSERT_TRUE(cluster_->drop_link(cluster_->worker(affected), false));
        break;
      }
      case Fault::kRestartEtcd: {
        cluster_->kill_etcd();
        pump(kEtcdDown);
        ASSERT_EQ(cluster_->start_etcd(), "");
        break;
      }
    }
    if (affected >= 0) std::cout << " on " << cluster_->worker(affected).ns.name();
    std::cout << std::endl;
    // Recovery: new requests through the affected process (any, for etcd) succeed, and after
    // etcd is back every live engine's record is in it again.
    recovery_since_ = Steady::now();
    recovered_.fill(0);
    recovered_any_ = 0;
    const bool etcd = f == Fault::kRestartEtcd;
    const bool recovered = pump_until(kRecoveryTimeout, [&] {
      if (etcd) {
        if (!registered_again_ && Steady::now() - last_key_check_ > 250ms) {
          last_key_check_ = Steady::now();
          registered_again_ = cluster_->all_registered();
          if (registered_again_) {
            std::cout << fmt::format(
                             "[chaos]   engines registered again {:.1f} s after etcd returned",
                             std::chrono::duration<double>(Steady::now() - recovery_since_).count())
                      << std::endl;
          }
        }
        return registered_again_ && recovered_any_ >= kRecoveredAfter;
      }
      return recovered_[affected] >= kRecoveredAfter;
    });
    registered_again_ = false;
    if (!recovered && affected >= 0) dump_stacks(cluster_->worker(affected));
    EXPECT_TRUE(recovered) << fault_name(f) << ": no " << kRecoveredAfter
                           << " new successful requests"
                           << (etcd ? " with every engine registered again" : "") << " within "
                           << kRecoveryTimeout.count() << " s; last failure there: "
                           << (affected >= 0 ? last_failures_[affected] : "");
  }

  // Every thread's stack of a worker that did not recover, beside the kept logs (gdb).
  void dump_stacks(ChaosCluster::Worker& w) {
    if (::access("/usr/bin/gdb", X_OK) != 0 || !w.process) return;
    const std::string file = fmt::format("/tmp/kvferry-chaos-{}-{}.stacks", seed_, w.ns.name());
    std::cout << "[chaos] " << w.ns.name() << " did not recover; its stacks:" << std::endl;
    const std::string command =
        fmt::format("/usr/bin/gdb -batch -ex 'thread apply all bt' -p {} > {} 2>&1",
                    w.process->process.pid(), file);
    if (std::system(command.c_str()) != 0) return;
    std::cout << "[chaos] stacks of " << w.ns.name() << " in " << file << std::endl;
  }

  double seconds_since_start() const {
    return std::chrono::duration<double>(Steady::now() - start_).count();
  }

  std::array<Footprint, 2> survivors_footprint() {
    return {footprint_of(cluster_->worker(1).process->process.pid()),
            footprint_of(cluster_->worker(3).process->process.pid())};
  }

  void print_summary(const std::array<Footprint, 2>& mid, const std::array<Footprint, 2>& end) {
    std::map<std::string, uint64_t> decode_outcomes, prefill_outcomes;
    for (auto& [room, r] : requests_) {
      for (auto [side, into] :
           {std::pair{&r.decode_side, &decode_outcomes}, {&r.prefill_side, &prefill_outcomes}}) {
        switch (side->outcome) {
          case Outcome::kSuccess: ++(*into)["Success"]; break;
          case Outcome::kFailed: ++(*into)["Failed " + side->reason]; break;
          default: ++(*into)["process killed (no report)"]; break;
        }
      }
    }
    std::vector<double> sorted = latencies_ms_;
    std::sort(sorted.begin(), sorted.end());
    auto pct = [&](double q) {
      return sorted.empty()
                 ? 0.0
                 : sorted[static_cast<size_t>(q * static_cast<double>(sorted.size() - 1))];
    };
    std::ostringstream out;
    out << fmt::format("== chaos summary (seed {}, {:.0f} s under load)\n", seed_, load_seconds_);
    out << "links: " << cluster_->impairment() << "\n";
    out << fmt::format("requests: {} ({} tokens at most, {} in flight)\n", requests_.size(),
                       kMaxTokens, kMaxInFlight);
    out << "faults injected:\n";
    for (Fault f : kAllFaults) out << fmt::format("  {:<40} {}\n", fault_name(f), faults_[f]);
    out << "decode outcomes:\n";
    for (auto& [why, n] : decode_outcomes) out << fmt::format("  {:<40} {}\n", why, n);
    out << "prefill outcomes:\n";
    for (auto& [why, n] : prefill_outcomes) out << fmt::format("  {:<40} {}\n", why, n);
    out << "pages of failed requests after the abort ack:";
    for (auto& [what, n] : released_) out << " " << what << " " << n;
    out << fmt::format("\nlatency (decode Success, from routing): p50 {:.1f} ms, p99 {:.1f} ms\n",
                       pct(0.50), pct(0.99));
    for (int i = 0; i < 2; ++i) {
      out << fmt::format("survivor {}: fds {} -> {}, threads {} -> {}, RSS {} -> {} MiB\n",
                         i == 0 ? "prefill 1" : "decode 1", mid[i].fds, end[i].fds, mid[i].threads,
                         end[i].threads, mid[i].rss_kib / 1024, end[i].rss_kib / 1024);
    }
    std::cout << out.str() << std::flush;
    RecordProperty("requests", static_cast<int>(requests_.size()));
    RecordProperty("p50_ms", static_cast<int>(pct(0.50)));
    RecordProperty("p99_ms", static_cast<int>(pct(0.99)));
  }

  std::optional<ChaosCluster> cluster_;
  std::chrono::seconds load_for_{90};
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;        // the load
  std::mt19937_64 fault_rng_;  // the faults: which, where, when
  Steady::time_point start_ = Steady::now();
  double load_seconds_ = 0;
  uint64_t next_room_ = 1;
  int pending_ = 0;
  std::map<uint64_t, Request> requests_;
  std::vector<double> latencies_ms_;
  std::map<Fault, int> faults_;
  std::map<std::string, uint64_t> released_;
  std::array<std::string, kWorkers> last_failures_;
  std::array<uint64_t, kWorkers> successes_since_{};
  std::array<int, kWorkers> recovered_{};
  int recovered_any_ = 0;
  Steady::time_point recovery_since_ = Steady::time_point::max();
  Steady::time_point last_key_check_{};
  bool registered_again_ = false;
  uint64_t excused_ = 0, hangs_ = 0;
};

TEST_F(Chaos, LoadedPdSurvivesKillsStopsEtcdRestartsAndLinkDrops) {
  std::cout << fmt::format(
                   "[chaos] seed {} (KVFERRY_CHAOS_SEED), {} s under load "
                   "(KVFERRY_CHAOS_SECONDS); links: {}",
                   seed_, load_for_.count(), cluster_->impairment())
            << std::endl;
  start_ = Steady::now();
  const auto load_end = start_ + load_for_;
  // Warm up without faults, so that survivors' footprints are past their first growth.
  pump(std::max<std::chrono::milliseconds>(5s, load_for_ / 10));

  // Every kind once, in random order, then random kinds while time is left; each after a
  // random pause. The footprints are sampled in the middle of the load and at its end.
  std::vector<Fault> plan(kAllFaults.begin(), kAllFaults.end());
  std::shuffle(plan.begin(), plan.end(), fault_rng_);
  std::optional<std::array<Footprint, 2>> mid;
  const auto mid_time = start_ + load_for_ / 2;
  for (size_t i = 0;; ++i) {
    if (i >= plan.size()) {
      if (Steady::now() + kFaultHold + 10s > load_end) break;
      plan.push_back(kAllFaults[fault_rng_() % kAllFaults.size()]);
    }
    pump(std::chrono::milliseconds(std::uniform_int_distribution<int>(1000, 4000)(fault_rng_)));
    if (!mid && Steady::now() >= mid_time) mid = survivors_footprint();
    inject(plan[i]);
    if (HasFatalFailure()) return;
  }
  if (!mid) mid = survivors_footprint();
  if (Steady::now() < load_end)
    pump(std::chrono::duration_cast<std::chrono::milliseconds>(load_end - Steady::now()));
  const std::array<Footprint, 2> end = survivors_footprint();
  load_seconds_ = seconds_since_start();

  // Drain: no new requests; everything sent must end within its deadline.
  const auto drain_end = Steady::now() + kRequestDeadline + 5s;
  while (pending_ > 0 && Steady::now() < drain_end) {
    while (auto e = cluster_->next_event(5ms)) on_event(*e);
    check_deadlines();
  }
  EXPECT_EQ(pending_, 0) << "requests without an outcome after the drain";
  EXPECT_EQ(hangs_, 0u);
  print_summary(*mid, end);
  for (Fault f : kAllFaults) EXPECT_GE(faults_[f], 1) << fault_name(f) << " was never injected";
  EXPECT_GT(latencies_ms_.size(), requests_.size() / 2) << "most requests should succeed";
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(end[i].fds, (*mid)[i].fds + kFdSlack) << "survivor " << i << " leaks fds";
    EXPECT_LE(end[i].threads, (*mid)[i].threads + kThreadSlack)
        << "survivor " << i << " leaks threads";
    EXPECT_LE(end[i].rss_kib, (*mid)[i].rss_kib + kRssSlackKib)
        << "survivor " << i << " leaks memory";
  }
}

}  // namespace
}  // namespace kvferry::testing
