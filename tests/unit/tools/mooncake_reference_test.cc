// mooncake_reference.h: reading transfer_engine_bench's log lines, and the contestant's
// processes, driven through stand-in scripts that speak its command line and log (Mooncake is
// not a Debian package; the real one is raced by hand: docs/PERFORMANCE.md, "Mooncake").
#include "mooncake_reference.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

namespace kvferry::cli {
namespace {

// Real lines of transfer_engine_bench (Mooncake 3b5a594, glog with --logtostderr).
constexpr const char* kDoneLine =
    "I20261207 10:58:26.144979 29525 transfer_engine_bench.cpp:569] Test completed: duration "
    "5.00, batch count 574, throughput 0.96 GB/s";
constexpr const char* kListeningLine =
    "I20261207 10:58:20.731022 29510 transfer_metadata.cpp:1523] Starting P2P handshake RPC "
    "using P2P handshake, listening on 127.0.0.1:15021";

TEST(MooncakeReport, GivesBatchesAndSecondsFromTheClosingLine) {
  auto w = parse_mooncake_report(kDoneLine);
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_DOUBLE_EQ(w->batches, 574);
  EXPECT_DOUBLE_EQ(w->seconds, 5.0);
}

TEST(MooncakeReport, RejectsOtherLinesAndAZeroDuration) {
  for (const char* line :
       {"E20261207 transfer_metadata.cpp:1050] Local segment descriptor not found",
        "Test completed: duration 0.00, batch count 3, throughput 0 GB/s", ""}) {
    EXPECT_FALSE(parse_mooncake_report(line).ok()) << line;
  }
}

TEST(MooncakeReport, TheTargetsPortComesFromItsListeningLineOnly) {
  EXPECT_EQ(mooncake_target_port(kListeningLine), 15021u);
  EXPECT_EQ(mooncake_target_port("listening on 127.0.0.1:99999"), 0u);
  EXPECT_EQ(mooncake_target_port("listening on 10.0.0.1:15021"), 0u);
  EXPECT_EQ(mooncake_target_port(kDoneLine), 0u);
}

// A stand-in for transfer_engine_bench: its target logs the listening line and stays up; its
// initiator checks every flag and the pool switch the contestant must pass, and reports 250
// batches in 0.50 s. Any other command line exits 3 without a report.
class StandIn {
 public:
  explicit StandIn(const std::string& target_body) {
    char dir_template[] = "/tmp/kvferry-mooncake-XXXXXX";
    const char* dir = ::mkdtemp(dir_template);
    EXPECT_NE(dir, nullptr) << "mkdtemp";
    dir_ = dir != nullptr ? dir : "/nonexistent";
    path_ = dir_ + "/transfer_engine_bench";
    std::ofstream(path_)
        << "#!/bin/sh\n"
        << "case \" $* \" in\n"
        << "  *' --mode=target '*) " << target_body << " ;;\n"
        << "esac\n"
        << "[ \"$MC_TCP_ENABLE_CONNECTION_POOL\" = 1 ] || exit 3\n"
        << "for f in --mode=initiator --protocol=tcp --metadata_server=P2PHANDSHAKE "
           "--segment_id=127.0.0.1:15021 --operation=write --block_size=65536 "
           "--batch_size=128 --threads=1 --duration=1 --buffer_size=8388608; do\n"
        << "  case \" $* \" in *\" $f \"*) ;; *) echo \"missing $f\"; exit 3;; esac\n"
        << "done\n"
        << "echo 'E20261207 transfer_metadata.cpp:1050] Local segment descriptor "
           "not found' >&2\n"
        << "echo 'I20261207 transfer_engine_bench.cpp:569] Test completed: duration 0.50, "
           "batch count 250, throughput 4.19 GB/s' >&2\n";
    ::chmod(path_.c_str(), 0755);
  }
  ~StandIn() {
    std::remove(path_.c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string dir_, path_;
};

const MooncakeCell kCell{"write", 65536, 128, 1};

TEST(MooncakeContestant, CountsMeasuredRunsFromItsOwnReport) {
  StandIn bench("echo '" + std::string(kListeningLine) + "' >&2; exec sleep 60");
  auto c = MooncakeContestant::start(bench.path(), kCell);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  ASSERT_TRUE((*c)->run(/*measuring=*/false).ok());  // the warm-up is not counted
  EXPECT_EQ((*c)->gbps(), 0);
  Status s = (*c)->run(/*measuring=*/true);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_DOUBLE_EQ((*c)->gbps(), 250.0 * 65536 * 128 / 0.5 / 1e9);
  EXPECT_DOUBLE_EQ((*c)->mean_us(), 0.5 / 250 * 1e6);
}

// The classes of failure a bench must end on, not hang on: a target that never says where
// it listens, a target that exits, and an initiator that exits without its report.
TEST(MooncakeContestant, ATargetThatNeverListensIsAnErrorWithinItsTimeout) {
  StandIn bench("echo 'starting' >&2; exec sleep 60");
  const auto began = std::chrono::steady_clock::now();
  // Long enough for the stand-in to have logged its line on a loaded machine.
  auto c = MooncakeContestant::start(bench.path(), kCell, std::chrono::seconds(2));
  ASSERT_FALSE(c.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(10));
  EXPECT_NE(c.status().to_string().find(bench.path()), std::string::npos) << c.status().to_string();
  EXPECT_NE(c.status().to_string().find("starting"), std::string::npos) << c.status().to_string();
}

TEST(MooncakeContestant, ATargetThatExitsIsAnError) {
  StandIn bench("echo 'bind failed' >&2; exit 1");
  auto c = MooncakeContestant::start(bench.path(), kCell);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().to_string().find("bind failed"), std::string::npos)
      << c.status().to_string();
}

TEST(MooncakeContestant, AnInitiatorWithoutItsReportIsAnErrorNamingItsLastLine) {
  StandIn bench("echo '" + std::string(kListeningLine) + "' >&2; exec sleep 60");
  MooncakeCell read_cell = kCell;
  read_cell.op = "read";  // the stand-in expects write: it exits 3 naming the flag
  auto c = MooncakeContestant::start(bench.path(), read_cell);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  Status s = (*c)->run(/*measuring=*/true);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.to_string().find("exited with 3"), std::string::npos) << s.to_string();
  EXPECT_NE(s.to_string().find("missing --operation=write"), std::string::npos) << s.to_string();
  EXPECT_EQ((*c)->gbps(), 0);
}

TEST(MooncakeContestant, ABinaryThatIsNotThereIsNamed) {
  auto c = MooncakeContestant::start("/nonexistent/transfer_engine_bench", kCell);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().to_string().find("/nonexistent/transfer_engine_bench"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::cli
