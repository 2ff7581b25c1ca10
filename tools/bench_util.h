// Small measuring helpers for the bench commands.
#pragma once

#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace kvferry::cli {

// Runs `once` (which returns false to stop) repeatedly for at least `min_time_ms` (and at
// least 3 times, at most 100,000), after one unmeasured warm-up; keeps each duration.
class LatencySampler {
 public:
  template <typename F>
  void run(int min_time_ms, F&& once) {
    if (!once()) return;  // warm-up: page faults, mappings, caches
    auto start = std::chrono::steady_clock::now();
    auto until = start + std::chrono::milliseconds(min_time_ms);
    while (samples_.size() < 3 ||
           (std::chrono::steady_clock::now() < until && samples_.size() < 100000)) {
      auto t0 = std::chrono::steady_clock::now();
      if (!once()) return;
      samples_.push_back(
          std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(samples_.begin(), samples_.end());
  }
  double mean_ns() const {
    double sum = 0;
    for (double s : samples_) sum += s;
    return samples_.empty() ? 0 : sum / samples_.size();
  }
  double percentile_us(double p) const {
    if (samples_.empty()) return 0;
    size_t i = std::min(samples_.size() - 1, static_cast<size_t>(p / 100.0 * samples_.size()));
    return samples_[i] / 1e3;
  }
  size_t count() const { return samples_.size(); }
  void add(double ns) { samples_.push_back(ns); }
  void finish() { std::sort(samples_.begin(), samples_.end()); }

 private:
  std::vector<double> samples_;
};

// How run_interleaved takes turns (see there).
struct InterleaveOptions {
  // Measuring time of the whole run, every contestant's turns together: rounds go on until it
  // has passed, and at least `min_rounds` and at most `max_rounds` run.
  int min_time_ms = 0;
  size_t min_rounds = 3;
  size_t max_rounds = 100000;
  // One contestant's turn in a round: calls for at least this long (at least one call); 0 is
  // one call per turn.
  double turn_ms = 0;
  // The unmeasured warm-up before the first round: each contestant, in order, calls for this
  // long (at least one call).
  double warmup_ms = 0;
  // Samples per contestant: a turn ends early at its share (max_samples / min_rounds), and no
  // round starts after min_rounds once a contestant has this many.
  size_t max_samples = 100000;
  // Called around each measured turn, outside the timed calls (e.g. a CPU meter per
  // contestant): before_turn(contestant), after_turn(contestant, calls in the turn).
  std::function<void(size_t)> before_turn;
  std::function<void(size_t, size_t)> after_turn;
};

// Runs the contestants in turns: after a warm-up of each, every round gives each contestant
// one turn (one call, or a block of calls for `turn_ms`), starting one contestant further each
// round. On a shared machine a slow spell then hits every contestant alike, so their ratios
// stay meaningful. Rounds are whole: every contestant gets as many turns. A contestant
// returning false stops the run. Returns one sampler per contestant (each call's duration).
inline std::vector<LatencySampler> run_interleaved(
    const InterleaveOptions& options, const std::vector<std::function<bool()>>& contestants) {
  using Clock = std::chrono::steady_clock;
  std::vector<LatencySampler> out(contestants.size());
  auto finish = [&out]() -> std::vector<LatencySampler> {
    for (auto& s : out) s.finish();
    return std::move(out);
  };
  auto full = [&out, &options] {
    return std::any_of(out.begin(), out.end(),
                       [&](const LatencySampler& s) { return s.count() >= options.max_samples; });
  };
  const auto warmup = std::chrono::duration<double, std::milli>(options.warmup_ms);
  for (const auto& c : contestants) {
    const auto start = Clock::now();
    do {
      if (!c()) return finish();
    } while (Clock::now() - start < warmup);
  }
  const auto turn = std::chrono::duration<double, std::milli>(options.turn_ms);
  const size_t per_turn =
      std::max<size_t>(1, options.max_samples / std::max<size_t>(1, options.min_rounds));
  const auto until = Clock::now() + std::chrono::milliseconds(options.min_time_ms);
  for (size_t round = 0; round < options.max_rounds &&
                         (round < options.min_rounds || (Clock::now() < until && !full()));
       ++round) {
    // The starting contestant rotates each round: whoever runs right after another one
    // inherits its cache state, and that must not always be the same contestant.
    for (size_t k = 0; k < contestants.size(); ++k) {
      const size_t i = (round + k) % contestants.size();
      if (options.before_turn) options.before_turn(i);
      const auto start = Clock::now();
      size_t calls = 0;
      bool ok = true;
      do {
        const auto t0 = Clock::now();
        ok = contestants[i]();
        if (!ok) break;
        out[i].add(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
        ++calls;
      } while (Clock::now() - start < turn && calls < per_turn &&
               out[i].count() < options.max_samples);
      if (options.after_turn) options.after_turn(i, calls);
      if (!ok) return finish();
    }
  }
  return finish();
}

// CPU time and voluntary context switches (sleeps: each one is a wake-up later) of a whole
// process, every thread included, read from /proc. CPU time has the kernel's tick
// resolution (10 ms at 100 Hz): measure over hundreds of milliseconds. Switches are kept per
// thread: a thread that ends between two reads takes its count with it, so only the threads
// alive at both reads (or started between them) are compared.
struct ProcessCpu {
  double cpu_s = 0;
  std::map<int, uint64_t> voluntary_switches;  // by thread id
};

inline ProcessCpu read_process_cpu(int pid) {
  ProcessCpu out;
  const std::string dir = "/proc/" + std::to_string(pid);
  {
    std::ifstream stat(dir + "/stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
    const size_t close = text.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(text.substr(close + 2));
      std::string field;
      double utime = 0, stime = 0;
      for (int i = 3; i <= 15 && fields >> field; ++i) {
        if (i == 14) utime = std::stod(field);
        if (i == 15) stime = std::stod(field);
      }
      out.cpu_s = (utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
    }
  }
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(dir + "/task", ec)) {
    std::ifstream status(task.path() / "status");
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        out.voluntary_switches[std::stoi(task.path().filename().string())] =
            std::stoull(line.substr(line.find(':') + 1));
      }
    }
  }
  return out;
}

// The switches of `end`'s threads since `start` (a thread new since then: all of its own).
inline uint64_t switches_since(const ProcessCpu& start, const ProcessCpu& end) {
  uint64_t n = 0;
  for (const auto& [tid, count] : end.voluntary_switches) {
    auto before = start.voluntary_switches.find(tid);
    const uint64_t base = before == start.voluntary_switches.end() ? 0 : before->second;
    n += count >= base ? count - base : count;  // below: a reused thread id, a new thread
  }
  return n;
}

// CPU and wake-ups of the two processes of a measurement, summed over every start() ...
// stop() span (one contestant's turns, say).
class CpuMeter {
 public:
  CpuMeter(int self_pid, int peer_pid) : self_(self_pid), peer_(peer_pid) {}
  void start() {
    self_start_ = read_process_cpu(self_);
    if (peer_ > 0) peer_start_ = read_process_cpu(peer_);
  }
  void stop() {
    ProcessCpu self_end = read_process_cpu(self_);
    ProcessCpu peer_end = peer_ > 0 ? read_process_cpu(peer_) : ProcessCpu{};
    cpu_s_ += self_end.cpu_s - self_start_.cpu_s + peer_end.cpu_s - peer_start_.cpu_s;
    switches_ += switches_since(self_start_, self_end) + switches_since(peer_start_, peer_end);
  }
  double cpu_s() const { return cpu_s_; }
  uint64_t switches() const { return switches_; }

 private:
  int self_, peer_;
  ProcessCpu self_start_, peer_start_;
  double cpu_s_ = 0;
  uint64_t switches_ = 0;
};

// A CPU load beside the measurement (`--load N`): N child processes that spin, placed by
// the scheduler like any other busy process of a serving host (the GPU driver, Python,
// tokenizers). Processes, not threads, so the contestants' CPU meters (which read this
// process and its peer) do not count them. They die with this process (PR_SET_PDEATHSIG)
// and are killed and reaped when the CpuLoad goes.
class CpuLoad {
 public:
  explicit CpuLoad(int n) {
    for (int i = 0; i < n; ++i) {
      const pid_t pid = ::fork();
      if (pid == 0) {  // only async-signal-safe calls from here on
        ::prctl(PR_SET_PDEATHSIG, SIGKILL);
        volatile uint64_t spin = 0;
        for (;;) spin = spin + 1;
      }
      if (pid > 0) children_.push_back(pid);
    }
  }
  CpuLoad(const CpuLoad&) = delete;
  CpuLoad& operator=(const CpuLoad&) = delete;
  ~CpuLoad() {
    for (pid_t pid : children_) ::kill(pid, SIGKILL);
    for (pid_t pid : children_) ::waitpid(pid, nullptr, 0);
  }
  size_t size() const { return children_.size(); }

 private:
  std::vector<pid_t> children_;
};

inline std::string format_bytes(uint64_t b) {
  if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{}MiB", b >> 20);
  if (b >= 1024 && b % 1024 == 0) return fmt::format("{}KiB", b >> 10);
  return fmt::format("{}B", b);
}

inline void write_json(const std::string& path, const nlohmann::json& value) {
  if (path == "-") {
    std::cout << value.dump(2) << "\n";
    return;
  }
  std::ofstream(path) << value.dump(2) << "\n";
}

}  // namespace kvferry::cli
