// Mooncake Transfer Engine's own benchmark (`transfer_engine_bench`, tcp transport, connection
// pool on) as a contestant of `bench engine`'s tcp cells: the engine kvferry replaces, raced in
// the same turns as kvferry and the plain references (docs/PERFORMANCE.md, "Mooncake").
//
// Mooncake is not a Debian package: the caller builds it and passes the binary's path. One
// target runs per cell; each turn is one initiator run of `--duration=1` (its shortest), whose
// figures are its own report: batches completed over the seconds it measured. Its start-up
// (process, handshake, registering its buffer) is outside them, as for iperf3.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/child_process.h"
#include "kvferry/status.h"

namespace kvferry::cli {

// One initiator run: batches completed, over how long.
struct MooncakeWindow {
  double batches = 0, seconds = 0;
};

// Reads the initiator's closing line, e.g. "I1207 10:58:26.144979 29525
// transfer_engine_bench.cpp:569] Test completed: duration 5.00, batch count 574, throughput
// 0.96 GB/s". InvalidArgument when `line` is not that line.
inline Result<MooncakeWindow> parse_mooncake_report(const std::string& line) {
  constexpr std::string_view kDone = "Test completed: duration ";
  const size_t at = line.find(kDone);
  MooncakeWindow w;
  if (at == std::string::npos || std::sscanf(line.c_str() + at + kDone.size(),
                                             "%lf, batch count %lf", &w.seconds, &w.batches) != 2) {
    return InvalidArgument("not a transfer_engine_bench report: " + line.substr(0, 200));
  }
  if (w.seconds <= 0) {
    return Internal(fmt::format("transfer_engine_bench reported duration {}", w.seconds));
  }
  return w;
}

// The port a target listens on, from its log line "... listening on 127.0.0.1:PORT"; 0 if the
// line has none.
inline unsigned mooncake_target_port(const std::string& line) {
  constexpr std::string_view kListening = "listening on 127.0.0.1:";
  const size_t at = line.find(kListening);
  if (at == std::string::npos) return 0;
  const char* digits = line.c_str() + at + kListening.size();
  unsigned port = 0;
  const auto [end, ec] = std::from_chars(digits, line.c_str() + line.size(), port);
  return ec == std::errc() && end != digits && port <= 65535 ? port : 0;
}

// What a cell asks of Mooncake.
struct MooncakeCell {
  std::string op;  // "write" or "read"
  uint64_t block = 0;
  int ops = 0;  // per batch
  int threads = 1;
  // Each side's buffer: a batch per thread, at least 1 MiB.
  uint64_t buffer_bytes() const {
    return std::max<uint64_t>(block * static_cast<uint64_t>(ops) * threads, 1u << 20);
  }
};

// A target (for one cell) and its initiator runs, on 127.0.0.1.
class MooncakeContestant {
 public:
  // Starts the target and waits (at most `timeout`) for the port it logs.
  static Result<std::unique_ptr<MooncakeContestant>> start(
      const std::string& binary, const MooncakeCell& cell,
      std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    if (::access(binary.c_str(), X_OK) != 0) {
      return InvalidArgument("bench engine: --mooncake " + binary + " is not an executable file");
    }
    std::vector<std::string> argv = common_argv(binary, cell);
    argv.insert(argv.end(), {"--mode=target", "--threads=1"});
    KVF_ASSIGN_OR_RETURN(ChildProcess target, ChildProcess::spawn(argv));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::string last;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      auto line = target.read_line(left);
      if (!line.ok()) break;  // timed out, or the target exited
      last = *line;
      if (unsigned port = mooncake_target_port(*line); port != 0) {
        return std::unique_ptr<MooncakeContestant>(
            new MooncakeContestant(binary, cell, port, std::move(target)));
      }
    }
    target.kill_now();
    return Internal(fmt::format(
        "bench engine: --mooncake {} target logged no 'listening on 127.0.0.1:PORT' in {} ms "
        "(last line: '{}')",
        binary, timeout.count(), last.substr(0, 200)));
  }
  MooncakeContestant(const MooncakeContestant&) = delete;
  MooncakeContestant& operator=(const MooncakeContestant&) = delete;
  ~MooncakeContestant() { target_.kill_now(); }

  // One initiator run; counted once `measuring` is set (after the interleaved warm-up).
  Status run(bool measuring) {
    std::vector<std::string> argv = common_argv(binary_, cell_);
    argv.insert(argv.end(), {"--mode=initiator", "--segment_id=127.0.0.1:" + std::to_string(port_),
                             "--operation=" + cell_.op, fmt::format("--block_size={}", cell_.block),
                             fmt::format("--batch_size={}", cell_.ops),
                             fmt::format("--threads={}", cell_.threads), "--duration=1"});
    KVF_ASSIGN_OR_RETURN(ChildProcess initiator, ChildProcess::spawn(argv));
    auto lines = initiator.read_to_end(std::chrono::seconds(60));
    if (!lines.ok()) {
      initiator.kill_now();
      return Internal("bench engine: Mooncake's initiator did not finish in 60 s");
    }
    std::optional<MooncakeWindow> window;
    for (const std::string& line : *lines) {
      if (auto w = parse_mooncake_report(line); w.ok()) window = *w;
    }
    KVF_ASSIGN_OR_RETURN(int exit_code, initiator.finish(std::chrono::seconds(5)));
    if (!window || exit_code != 0) {
      return Internal(
          fmt::format("bench engine: Mooncake's initiator exited with {} (last line: '{}')",
                      exit_code, lines->empty() ? std::string() : lines->back().substr(0, 200)));
    }
    if (measuring) {
      total_.batches += window->batches;
      total_.seconds += window->seconds;
    }
    return Status::Ok();
  }

  double gbps() const {
    return total_.seconds > 0 ? total_.batches * static_cast<double>(cell_.block) * cell_.ops /
                                    total_.seconds / 1e9
                              : 0;
  }
  // Mean microseconds per batch per thread (its report has no distribution).
  double mean_us() const {
    return total_.batches > 0 ? total_.seconds * cell_.threads / total_.batches * 1e6 : 0;
  }

 private:
  MooncakeContestant(std::string binary, MooncakeCell cell, unsigned port, ChildProcess target)
      : binary_(std::move(binary)),
        cell_(std::move(cell)),
        port_(port),
        target_(std::move(target)) {}

  // Through sh, to set the pool switch (Mooncake reads it from the environment) and to read
  // glog's stderr on the pipe: "$0" "$@" keep the path and flags as given.
  static std::vector<std::string> common_argv(const std::string& binary, const MooncakeCell& cell) {
    return {"/bin/sh",
            "-c",
            "MC_TCP_ENABLE_CONNECTION_POOL=1 exec \"$0\" \"$@\" 2>&1",
            binary,
            "--protocol=tcp",
            "--metadata_server=P2PHANDSHAKE",
            "--local_server_name=127.0.0.1",
            fmt::format("--buffer_size={}", cell.buffer_bytes()),
            "--logtostderr"};
  }

  std::string binary_;
  MooncakeCell cell_;
  unsigned port_;
  ChildProcess target_;
  MooncakeWindow total_;
};

}  // namespace kvferry::cli
