// iperf3 (Debian's iperf3, single stream on loopback) as a contestant of `bench engine`'s tcp and
// ucx cells, so that the external reference is measured in the same window as kvferry, turn for
// turn, instead of seconds or minutes apart (docs/PERFORMANCE.md, "Method").
//
// One `iperf3 -s` serves the whole bench; each turn is one client run (`-c -n BYTES -J`) whose
// GB/s and CPU come from iperf3's own report: bytes and seconds received, and both processes'
// CPU over the test (iperf3's host_total and remote_total, percent of one CPU). The client's
// start-up (exec, control connection) is outside its figures.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/child_process.h"
#include "kvferry/status.h"

namespace kvferry::cli {

// One iperf3 test: bytes received, over how long, and CPU-seconds of both ends.
struct Iperf3Window {
  double bytes = 0, seconds = 0, cpu_s = 0;
};

// Reads the report of `iperf3 -c ... -J`. iperf3 reports failures in the same JSON ("error"),
// often with exit status 0: that text is the error.
inline Result<Iperf3Window> parse_iperf3_report(const std::string& text) {
  nlohmann::json report = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (report.is_discarded()) {
    return Internal("iperf3 printed no JSON report: " + text.substr(0, 200));
  }
  if (report.contains("error")) return Internal("iperf3: " + report["error"].dump());
  const nlohmann::json& end = report.value("end", nlohmann::json::object());
  if (!end.contains("sum_received") || !end.contains("cpu_utilization_percent")) {
    return Internal("iperf3 report has no end.sum_received or end.cpu_utilization_percent");
  }
  const nlohmann::json& received = end["sum_received"];
  const nlohmann::json& cpu = end["cpu_utilization_percent"];
  Iperf3Window w;
  w.bytes = received.value("bytes", 0.0);
  w.seconds = received.value("seconds", 0.0);
  if (w.bytes <= 0 || w.seconds <= 0) {
    return Internal(fmt::format("iperf3 report: {} bytes in {} s", w.bytes, w.seconds));
  }
  w.cpu_s = (cpu.value("host_total", 0.0) + cpu.value("remote_total", 0.0)) / 100 * w.seconds;
  return w;
}

// The sum of a contestant's measured windows.
class Iperf3Tally {
 public:
  void add(const Iperf3Window& w) {
    total_.bytes += w.bytes;
    total_.seconds += w.seconds;
    total_.cpu_s += w.cpu_s;
  }
  const Iperf3Window& total() const { return total_; }
  double gbps() const { return total_.seconds > 0 ? total_.bytes / total_.seconds / 1e9 : 0; }
  double cpu_s_per_gb() const { return total_.bytes > 0 ? total_.cpu_s / (total_.bytes / 1e9) : 0; }

 private:
  Iperf3Window total_;
};

// `iperf3 -s` on 127.0.0.1:port for the bench's lifetime, and its client runs.
class Iperf3Server {
 public:
  // Starts the server and waits (at most 5 s) until a first short client run succeeds.
  static Result<std::unique_ptr<Iperf3Server>> start(const std::string& binary, unsigned port) {
    if (::access(binary.c_str(), X_OK) != 0) {
      return InvalidArgument("bench engine: --iperf3 " + binary + " is not an executable file");
    }
    KVF_ASSIGN_OR_RETURN(
        ChildProcess server,
        ChildProcess::spawn({binary, "-s", "-p", std::to_string(port), "--logfile", "/dev/null"}));
    std::unique_ptr<Iperf3Server> out(new Iperf3Server(binary, port, std::move(server)));
    Status last;
    for (int attempt = 0; attempt < 50; ++attempt) {
      auto w = out->run(1 << 20, 0);
      if (w.ok()) return out;
      last = w.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Internal(fmt::format("bench engine: --iperf3 {} on port {} did not answer: {}", binary,
                                port, last.to_string()));
  }
  Iperf3Server(const Iperf3Server&) = delete;
  Iperf3Server& operator=(const Iperf3Server&) = delete;
  ~Iperf3Server() { server_.kill_now(); }

  // One test of `bytes` (iperf3 -n), writes of `length` bytes (-l; 0: iperf3's default, 128 KiB).
  Result<Iperf3Window> run(uint64_t bytes, uint64_t length) const {
    std::vector<std::string> argv = {
        binary_, "-c", "127.0.0.1", "-p", std::to_string(port_), "-n", std::to_string(bytes), "-J"};
    if (length != 0) argv.insert(argv.end(), {"-l", std::to_string(length)});
    KVF_ASSIGN_OR_RETURN(ChildProcess client, ChildProcess::spawn(argv));
    auto lines = client.read_to_end(std::chrono::seconds(60));
    if (!lines.ok()) {
      client.kill_now();
      return Internal("bench engine: iperf3 client did not finish in 60 s");
    }
    std::string text;
    for (const std::string& line : *lines) text += line + "\n";
    KVF_ASSIGN_OR_RETURN(int exit_code, client.finish(std::chrono::seconds(5)));
    KVF_ASSIGN_OR_RETURN(Iperf3Window w, parse_iperf3_report(text));
    if (exit_code != 0) return Internal(fmt::format("iperf3 client exited with {}", exit_code));
    return w;
  }

 private:
  Iperf3Server(std::string binary, unsigned port, ChildProcess server)
      : binary_(std::move(binary)), port_(port), server_(std::move(server)) {}
  std::string binary_;
  unsigned port_;
  ChildProcess server_;
};

// One iperf3 contestant (a write length): each call is one client run sized to last about
// `turn_ms` at the rate of its previous run; windows count once `measuring` is set (after the
// interleaved warm-up).
class Iperf3Contestant {
 public:
  Iperf3Contestant(const Iperf3Server& server, uint64_t length, double turn_ms)
      : server_(server), length_(length), turn_ms_(turn_ms) {}
  Status run(bool measuring) {
    KVF_ASSIGN_OR_RETURN(Iperf3Window w, server_.run(next_bytes_, length_));
    const double per_turn = w.bytes / w.seconds * turn_ms_ / 1e3;
    next_bytes_ = static_cast<uint64_t>(std::clamp(per_turn, 16.0 * (1 << 20), 8.0 * (1u << 30)));
    if (measuring) tally_.add(w);
    return Status::Ok();
  }
  const Iperf3Tally& tally() const { return tally_; }

 private:
  const Iperf3Server& server_;
  uint64_t length_;
  double turn_ms_;
  uint64_t next_bytes_ = 128ull << 20;
  Iperf3Tally tally_;
};

}  // namespace kvferry::cli
