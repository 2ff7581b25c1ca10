// `kvferry doctor` run as a user would, its verdicts on this machine checked: shm usable, no
// CUDA device (unless the machine has one), the routes to a local peer, and a failing exit
// code for a peer that is not there.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "core/child_process.h"
#include "core/net.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::must;

struct DoctorRun {
  int exit_code = -1;
  nlohmann::json report;
};

DoctorRun run_doctor(std::vector<std::string> extra) {
  std::vector<std::string> argv = {KVFERRY_CLI_PATH, "doctor", "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  ChildProcess child = must(ChildProcess::spawn(argv));
  std::string text;
  for (;;) {
    Result<std::string> line = child.read_line(30s);
    if (!line.ok()) break;  // end of output (or a hang, caught by the exit code below)
    text += *line + "\n";
  }
  DoctorRun run;
  run.exit_code = must(child.finish(10s));
  run.report = nlohmann::json::parse(text, nullptr, false);
  EXPECT_FALSE(run.report.is_discarded()) << text;
  return run;
}

const nlohmann::json* check_named(const nlohmann::json& report, const std::string& name) {
  for (const nlohmann::json& c : report["checks"]) {
    if (c["name"] == name) return &c;
  }
  return nullptr;
}

const nlohmann::json* route(const nlohmann::json& report, const std::string& local,
                            const std::string& remote) {
  for (const nlohmann::json& r : report["routes"]) {
    if (r["local"] == local && r["remote"] == remote) return &r;
  }
  return nullptr;
}

TEST(Doctor, ThisMachineHasUsableShmAndNoCudaDevice) {
  DoctorRun run = run_doctor({});
  EXPECT_EQ(run.exit_code, 0) << run.report.dump(2);
  EXPECT_EQ(run.report["usable"], true);
  const nlohmann::json* shm = check_named(run.report, "shm");
  ASSERT_NE(shm, nullptr);
  EXPECT_EQ((*shm)["verdict"], "ok") << shm->dump();
  EXPECT_EQ((*shm)["value"], "usable");
  const nlohmann::json* cuda = check_named(run.report, "cuda");
  ASSERT_NE(cuda, nullptr);
  if (std::filesystem::exists("/dev/nvidia0")) {
    EXPECT_EQ((*cuda)["verdict"], "ok") << cuda->dump();
  } else {
    EXPECT_EQ((*cuda)["verdict"], "info") << cuda->dump();
    EXPECT_TRUE((*cuda)["value"] == "no device" || (*cuda)["value"] == "not built") << cuda->dump();
  }
  for (const char* name : {"cross_memory_attach", "ucx", "memlock", "huge_pages", "tcp_buffers"}) {
    EXPECT_NE(check_named(run.report, name), nullptr) << name;
  }
}

TEST(Doctor, RouteToALocalPeerIsShmForItsSharedMemoryAndCmaOrTcpForTheRest) {
  std::unique_ptr<TransferEngine> peer = testing::make_engine("doctor-peer");
  must(peer->allocate_shared(1 << 20));
  DoctorRun run = run_doctor({"--peer", peer->endpoint()});
  EXPECT_EQ(run.exit_code, 0) << run.report.dump(2);
  const nlohmann::json* to_shared = route(run.report, "host", "shared_host");
  ASSERT_NE(to_shared, nullptr) << run.report.dump(2);
  EXPECT_EQ((*to_shared)["transport"], "shm") << to_shared->dump(2);
  EXPECT_NE((*to_shared)["reason"].get<std::string>().find("same host"), std::string::npos);
  // Every other transport says why it is out.
  for (const nlohmann::json& other : (*to_shared)["others"]) {
    EXPECT_FALSE(other["out"].get<std::string>().empty()) << other.dump();
    if (other["transport"] == "tcp") {
      EXPECT_EQ(other["out"], "could carry it, but shm comes first");
    }
  }
  // Memory the peer did not allocate_shared cannot be mapped here: cross-memory attach
  // carries it where the kernel permits it (the doctor's own probe says), else tcp.
  const nlohmann::json* to_host = route(run.report, "host", "host");
  ASSERT_NE(to_host, nullptr);
  const nlohmann::json* cma = check_named(run.report, "cross_memory_attach");
  ASSERT_NE(cma, nullptr);
  EXPECT_EQ((*to_host)["transport"], (*cma)["value"] == "permitted" ? "cma" : "tcp")
      << to_host->dump(2);
}

TEST(Doctor, PeerThatIsNotThereIsSomethingWrong) {
  // A port nothing listens on: bind one, note it, close it.
  std::string endpoint;
  {
    Endpoint bound;
    Result<Fd> fd = listen_tcp(must(parse_endpoint("127.0.0.1:0", true)), &bound);
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    endpoint = bound.to_string();
  }
  DoctorRun run = run_doctor({"--peer", endpoint});
  EXPECT_EQ(run.exit_code, 1) << run.report.dump(2);
  EXPECT_EQ(run.report["usable"], false);
  const nlohmann::json* peer = check_named(run.report, "peer");
  ASSERT_NE(peer, nullptr);
  EXPECT_EQ((*peer)["verdict"], "FAIL");
  EXPECT_NE((*peer)["detail"].get<std::string>().find(endpoint), std::string::npos) << peer->dump();
}

}  // namespace
}  // namespace kvferry
