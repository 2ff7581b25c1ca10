// The PD demo across two hosts over ucx: prefill (and the bootstrap server) on this host,
// decode in another network and pid namespace (two_hosts.h), every route forced to ucx over
// UCX's tcp transport on the veth pair (emulation explicitly allowed), every page verified
// by decode. And what `--transport ucx` says in a build without UCX, through the seam that
// decides it (parse_worker_transport) and, in such a build, through the CLI itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/child_process.h"
#include "pd_model.h"
#include "test_support.h"
#include "two_hosts.h"

namespace kvferry {
namespace {

using testing::must;

TEST(PdWorkerTransport, UcxInABuildWithoutUcxSaysItIsNotBuilt) {
  const TransportSet without_ucx = {TransportKind::kLocal, TransportKind::kShm, TransportKind::kTcp,
                                    TransportKind::kCma};
  auto ucx = cli::parse_worker_transport("ucx", without_ucx);
  ASSERT_FALSE(ucx.ok());
  EXPECT_EQ(ucx.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(ucx.status().message().find("ucx is not built"), std::string::npos)
      << ucx.status().message();
  EXPECT_EQ(*must(cli::parse_worker_transport("tcp", without_ucx)), TransportKind::kTcp);
  const TransportSet with_ucx = {TransportKind::kShm, TransportKind::kTcp, TransportKind::kUcx};
  EXPECT_EQ(*must(cli::parse_worker_transport("ucx", with_ucx)), TransportKind::kUcx);
  EXPECT_FALSE(must(cli::parse_worker_transport("auto", without_ucx)).has_value());
  auto local = cli::parse_worker_transport("local", with_ucx);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.status().message().find("local"), std::string::npos) << local.status().message();
}

#ifndef KVFERRY_WITH_UCX
TEST(PdWorkerTransport, DemoOverUcxSaysItIsNotBuilt) {
  ChildProcess demo = must(ChildProcess::spawn(
      {"/bin/sh", "-c", std::string(KVFERRY_CLI_PATH) + " demo --transport ucx 2>&1"}));
  const std::string line = must(demo.read_line(std::chrono::seconds(30)));
  EXPECT_NE(line.find("ucx is not built"), std::string::npos) << line;
  EXPECT_EQ(must(demo.finish(std::chrono::seconds(30))), 1);
}
#else
// Without a secret, and with KVFERRY_SECRET set on both hosts (the worker addresses then
// travel sealed and each side opens the other's before using it).
class PdTwoHostsOverUcx : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string why_not = hosts_.setup("kvu");
    if (!why_not.empty()) GTEST_SKIP() << why_not;
  }
  testing::TwoHostNamespaces hosts_;
};

// Several chunks per request, prefill TP 2 to decode TP 1 (head slicing across hosts).
TEST_P(PdTwoHostsOverUcx, DecodeVerifiesEveryPage) {
  const std::string secret = GetParam();
  // Each side's UCX uses its own end of the veth pair only (this host has other interfaces,
  // the other host's loopback is not ours).
  std::vector<std::string> peer_env = {"UCX_NET_DEVICES=" + hosts_.peer_device()};
  std::vector<std::string> argv = {"/usr/bin/env", "UCX_TLS=tcp",
                                   "UCX_NET_DEVICES=" + hosts_.local_device(),
                                   "KVFERRY_UCX_ALLOW_EMULATED=1"};
  if (!secret.empty()) {
    peer_env.push_back("KVFERRY_SECRET=" + secret);
    argv.push_back("KVFERRY_SECRET=" + secret);
  }
  std::string launcher;
  for (const std::string& word : hosts_.launcher(peer_env)) {
    launcher += (launcher.empty() ? "" : " ") + word;
  }
  const std::vector<std::string> demo_args = {KVFERRY_CLI_PATH,
                                              "demo",
                                              "--json",
                                              "--transport",
                                              "ucx",
                                              "--listen",
                                              hosts_.local_ip() + ":0",
                                              "--bootstrap-listen",
                                              hosts_.local_ip() + ":0",
                                              "--decode-listen",
                                              hosts_.peer_ip() + ":0",
                                              "--decode-launcher",
                                              launcher,
                                              "--heartbeat-ms",
                                              "200",
                                              "--model",
                                              "tiny-mha",
                                              "--prefill-tp",
                                              "2",
                                              "--requests",
                                              "24",
                                              "--pool-pages",
                                              "128",
                                              "--min-tokens",
                                              "40",
                                              "--max-tokens",
                                              "200",
                                              "--chunk-tokens",
                                              "32",
                                              "--timeout-s",
                                              "120"};
  argv.insert(argv.end(), demo_args.begin(), demo_args.end());
  ChildProcess demo = must(ChildProcess::spawn(argv));
  const std::string line = must(demo.read_line(std::chrono::seconds(150)));
  auto s = nlohmann::json::parse(line, nullptr, false);
  ASSERT_FALSE(s.is_discarded()) << line;
  EXPECT_EQ(must(demo.finish(std::chrono::seconds(30))), 0) << line;
  EXPECT_EQ(s["requests"], 24) << line;
  EXPECT_EQ(s["succeeded"], 24) << line;
  EXPECT_EQ(s["failed"], 0) << line;
  EXPECT_EQ(s["corrupt_pages"], 0) << line;
  EXPECT_GE(s["pages_verified"].get<uint64_t>(), 24u) << line;
  EXPECT_GT(s["bytes"].get<uint64_t>(), 0u) << line;
}

INSTANTIATE_TEST_SUITE_P(Secret, PdTwoHostsOverUcx, ::testing::Values("", "s3cret"),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           return std::string(*param.param == '\0' ? "None" : "Shared");
                         });
#endif

}  // namespace
}  // namespace kvferry
