// iperf3_reference.h: reading iperf3's JSON report, and a real iperf3 on loopback (when the
// machine has it: scripts/setup.sh installs it) racing as bench engine's contestant.
#include "iperf3_reference.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <string>

#include "core/net.h"

namespace kvferry::cli {
namespace {

// The end of a real `iperf3 -c 127.0.0.1 -n 512M -J` report (iperf3 3.12), trimmed.
constexpr const char* kReport = R"({
  "start": {"version": "iperf 3.12"},
  "end": {
    "sum_received": {"start": 0, "end": 0.25, "seconds": 0.25, "bytes": 536870912},
    "cpu_utilization_percent": {"host_total": 92.0, "remote_total": 46.0}
  }
})";

// A loopback port nothing listens on now, below the kernel's ephemeral range: the port is
// closed again before iperf3 binds it, and a port from that range (what port 0 would give)
// can meanwhile become the source port of any loopback connection another test opens.
unsigned free_port() {
  unsigned ephemeral_low = 32768;
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) {
    range >> ephemeral_low;
  }
  std::mt19937 pick(std::random_device{}());
  for (int attempt = 0; attempt < 100 && ephemeral_low > 10001; ++attempt) {
    const auto port = static_cast<uint16_t>(
        std::uniform_int_distribution<unsigned>(10000, ephemeral_low - 1)(pick));
    Endpoint bound;
    if (listen_tcp({"127.0.0.1", port}, &bound).ok()) return port;
  }
  return 0;
}

TEST(Iperf3Report, GivesBytesSecondsAndBothEndsCpuSeconds) {
  auto w = parse_iperf3_report(kReport);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_DOUBLE_EQ(w->bytes, 536870912.0);
  EXPECT_DOUBLE_EQ(w->seconds, 0.25);
  EXPECT_DOUBLE_EQ(w->cpu_s, (0.92 + 0.46) * 0.25);

  Iperf3Tally tally;
  tally.add(*w);
  tally.add({1e9, 0.5, 0.25});
  EXPECT_DOUBLE_EQ(tally.gbps(), (536870912.0 + 1e9) / 0.75 / 1e9);
  EXPECT_DOUBLE_EQ(tally.cpu_s_per_gb(), (w->cpu_s + 0.25) / ((536870912.0 + 1e9) / 1e9));
}

TEST(Iperf3Report, ItsErrorTextIsTheError) {
  auto w = parse_iperf3_report(
      R"({"start": {}, "end": {}, "error": "unable to connect to server: Connection refused"})");
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().to_string().find("Connection refused"), std::string::npos);
}

TEST(Iperf3Report, RejectsWhatIsNotAReport) {
  for (const char* text : {"iperf3: parameter error", R"({"end": {}})",
                           R"({"end": {"sum_received": {"bytes": 0, "seconds": 0.2},
                                       "cpu_utilization_percent": {}}})"}) {
    auto w = parse_iperf3_report(text);
    EXPECT_FALSE(w.ok()) << text;
  }
}

TEST(Iperf3Server, ABinaryThatIsNotThereIsNamed) {
  auto server = Iperf3Server::start("/nonexistent/iperf3", 9161);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().to_string().find("/nonexistent/iperf3"), std::string::npos);
}

TEST(Iperf3Server, AContestantCountsOnlyMeasuredRunsOfAboutATurn) {
  const std::string binary = "/usr/bin/iperf3";
  if (::access(binary.c_str(), X_OK) != 0) GTEST_SKIP() << "no " << binary;
  const unsigned port = free_port();
  ASSERT_NE(port, 0u);
  auto server = Iperf3Server::start(binary, port);
  ASSERT_TRUE(server.ok()) << server.status().to_string();

  // A turn short enough that a run sized to it stays well under the warm-up's 128 MiB on a
  // fast loopback too (7 GB/s moves 140 MB in 20 ms; 5 ms at up to 25 GB/s stays under).
  Iperf3Contestant contestant(**server, 1 << 20, /*turn_ms=*/5);
  ASSERT_TRUE(contestant.run(/*measuring=*/false).ok());  // warm-up: 128 MiB, not counted
  EXPECT_EQ(contestant.tally().gbps(), 0);
  ASSERT_TRUE(contestant.run(/*measuring=*/true).ok());
  // A run sized to 5 ms at the warm-up's rate, and at least 16 MiB, not the warm-up's 128 MiB
  // with it. The count is the receiver's (end.sum_received), which leaves out what was still
  // in flight when the sender ended the test (15.93 of 16 MiB counted in a loaded CI run):
  // more than half the floor is what a sized run shows whatever the load.
  const Iperf3Window& total = contestant.tally().total();
  EXPECT_GT(total.bytes, 8.0 * (1 << 20));
  EXPECT_LT(total.bytes, 128.0 * (1 << 20));
  EXPECT_GT(total.seconds, 0);
  EXPECT_GT(total.cpu_s, 0);
}

}  // namespace
}  // namespace kvferry::cli
