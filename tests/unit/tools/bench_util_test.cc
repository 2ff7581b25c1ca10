// run_interleaved (tools/bench_util.h): the turns the bench commands measure in, and the
// per-contestant accounting around them.
#include "bench_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

namespace kvferry::cli {
namespace {

// Events in the order they happened: a call (contestant), a turn's start or end.
struct Event {
  enum Kind { kCall, kBegin, kEnd } kind;
  size_t contestant;
  size_t calls = 0;  // kEnd: what after_turn was told
};

std::vector<std::function<bool()>> logging_contestants(size_t n, std::vector<Event>& log) {
  std::vector<std::function<bool()>> out;
  for (size_t i = 0; i < n; ++i) {
    out.emplace_back([&log, i] {
      log.push_back({Event::kCall, i});
      return true;
    });
  }
  return out;
}

TEST(RunInterleaved, OneCallPerTurnRotatesTheFirstContestantEachRound) {
  std::vector<Event> log;
  InterleaveOptions options;
  options.min_rounds = 5;
  std::vector<LatencySampler> samples = run_interleaved(options, logging_contestants(3, log));
  std::vector<size_t> order;
  for (const Event& e : log) order.push_back(e.contestant);
  // The warm-up (one call each, in order), then rounds starting at 0, 1, 2, 0, 1.
  const std::vector<size_t> expected = {0, 1, 2,  // warm-up
                                        0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2, 1, 2, 0};
  EXPECT_EQ(order, expected);
  ASSERT_EQ(samples.size(), 3u);
  for (const LatencySampler& s : samples) EXPECT_EQ(s.count(), 5u);  // warm-up not sampled
}

TEST(RunInterleaved, TurnsAreBlocksOfCallsMeteredPerContestant) {
  std::vector<Event> log;
  std::vector<std::function<bool()>> contestants;
  for (size_t i = 0; i < 2; ++i) {
    contestants.emplace_back([&log, i] {
      log.push_back({Event::kCall, i});
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      return true;
    });
  }
  InterleaveOptions options;
  options.min_rounds = 4;
  options.turn_ms = 2;
  options.warmup_ms = 1;
  std::vector<size_t> calls_told(2, 0), turns(2, 0);
  options.before_turn = [&](size_t i) { log.push_back({Event::kBegin, i}); };
  options.after_turn = [&](size_t i, size_t calls) {
    log.push_back({Event::kEnd, i, calls});
    calls_told[i] += calls;
    ++turns[i];
  };
  std::vector<LatencySampler> samples = run_interleaved(options, contestants);

  // Before the first turn: the warm-up, contestant 0's calls then 1's, none sampled.
  size_t at = 0;
  size_t warm[2] = {0, 0};
  size_t last = 0;
  while (at < log.size() && log[at].kind == Event::kCall) {
    EXPECT_GE(log[at].contestant, last);
    last = log[at].contestant;
    ++warm[log[at++].contestant];
  }
  EXPECT_GE(warm[0], 1u);
  EXPECT_GE(warm[1], 1u);
  // Then whole turns: begin(i), only i's calls (at least one), end(i, that many).
  std::vector<size_t> turn_order;
  while (at < log.size()) {
    ASSERT_EQ(log[at].kind, Event::kBegin) << "event " << at;
    const size_t i = log[at++].contestant;
    turn_order.push_back(i);
    size_t calls = 0;
    while (at < log.size() && log[at].kind == Event::kCall) {
      EXPECT_EQ(log[at++].contestant, i);
      ++calls;
    }
    ASSERT_LT(at, log.size());
    ASSERT_EQ(log[at].kind, Event::kEnd);
    EXPECT_EQ(log[at].contestant, i);
    EXPECT_EQ(log[at++].calls, calls);
    EXPECT_GE(calls, 1u);
  }
  EXPECT_EQ(turn_order, (std::vector<size_t>{0, 1, 1, 0, 0, 1, 1, 0}));
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(turns[i], 4u);
    EXPECT_EQ(samples[i].count(), calls_told[i]) << "contestant " << i;
  }
}

TEST(RunInterleaved, SampleCapEndsTurnsAndRounds) {
  std::vector<Event> log;
  InterleaveOptions options;
  options.min_rounds = 2;
  options.min_time_ms = 60000;  // the cap, not the clock, must end this run
  options.turn_ms = 60000;
  options.max_samples = 10;
  std::vector<LatencySampler> samples = run_interleaved(options, logging_contestants(2, log));
  // 10 / 2 rounds = 5 calls a turn, two rounds, then every contestant is full.
  EXPECT_EQ(samples[0].count(), 10u);
  EXPECT_EQ(samples[1].count(), 10u);
  EXPECT_EQ(log.size(), 2u + 20u);
}

TEST(RunInterleaved, AContestantThatFailsStopsTheRun) {
  std::vector<Event> log;
  int calls_of_1 = 0;
  std::vector<std::function<bool()>> contestants = logging_contestants(3, log);
  contestants[1] = [&] {
    log.push_back({Event::kCall, 1});
    return ++calls_of_1 < 3;  // warm-up, round 0, then fails in round 1
  };
  size_t ended = 0;
  InterleaveOptions options;
  options.min_rounds = 5;
  options.after_turn = [&](size_t, size_t) { ++ended; };
  std::vector<LatencySampler> samples = run_interleaved(options, contestants);
  ASSERT_FALSE(log.empty());
  EXPECT_EQ(log.back().contestant, 1u);  // nothing ran after the failure
  EXPECT_EQ(calls_of_1, 3);
  // Round 0: 0, 1, 2; round 1 starts with 1, which fails (its turn still ends).
  EXPECT_EQ(ended, 4u);
  EXPECT_EQ(samples[0].count(), 1u);
  EXPECT_EQ(samples[1].count(), 1u);
  EXPECT_EQ(samples[2].count(), 1u);
}

TEST(RunInterleaved, DefaultOptionsRunAtLeastThreeRounds) {
  std::vector<Event> log;
  std::vector<LatencySampler> samples =
      run_interleaved(InterleaveOptions{}, logging_contestants(2, log));
  EXPECT_EQ(samples[0].count(), 3u);
  EXPECT_EQ(samples[1].count(), 3u);
}

TEST(CpuMeter, SumsEverySpanBetweenStartAndStop) {
  CpuMeter meter(::getpid(), -1);
  meter.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a sleep: one voluntary switch
  meter.stop();
  const uint64_t first = meter.switches();
  const double first_cpu = meter.cpu_s();
  EXPECT_GE(first, 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));  // not metered
  meter.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  meter.stop();
  EXPECT_GE(meter.switches(), first + 1);
  EXPECT_GE(meter.cpu_s(), first_cpu);
}

}  // namespace
}  // namespace kvferry::cli
