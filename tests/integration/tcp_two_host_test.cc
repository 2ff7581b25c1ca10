// Two hosts: the peer runs in its own network namespace and its own pid namespace (so its
// host identity, boot_id + pid namespace, differs from ours), reached over a veth pair
// with addresses from 198.18.0.0/15, the range reserved for benchmarking. Nothing forces
// a transport: the engine must pick tcp by itself. Bytes are verified by the peer.
// Needs root, iproute2 and util-linux's unshare; skipped (never passed) without them.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "core/child_process.h"
#include "core/host_identity.h"
#include "core/net.h"
#include "core/pattern.h"
#include "integration/netns_support.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::kIp;
using testing::kUnshare;
using testing::must;
using testing::run_quietly;

constexpr uint64_t kPeerBytes = 64ull << 20;
constexpr auto kPeerReplyTimeout = std::chrono::seconds(60);

class TwoHosts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = testing::netns_unavailable(); !why.empty()) GTEST_SKIP() << why;
    if (::access(kUnshare, X_OK) != 0) GTEST_SKIP() << kUnshare << " is not installed";
    // Per-process names and subnet, so parallel test processes do not collide.
    const int pid = ::getpid();
    const std::string subnet = fmt::format("198.{}.{}", 18 + (pid / 256) % 2, pid % 256);
    local_ip_ = subnet + ".1";
    peer_ip_ = subnet + ".2";
    if (!netns_.create(fmt::format("kvh{}", pid)) ||
        !testing::add_veth_pair({"", netns_.name() + "a", local_ip_ + "/24"},
                                {netns_.name(), netns_.name() + "b", peer_ip_ + "/24"})) {
      GTEST_SKIP() << "cannot create a network namespace joined by a veth pair here";
    }
    ns_ = netns_.name();
    if (run_quietly(fmt::format("{} netns exec {} {} --pid --fork --kill-child --mount-proc true",
                                kIp, ns_, kUnshare)) != 0) {
      GTEST_SKIP() << "cannot create a pid namespace (unshare --pid) here";
    }
  }

  void TearDown() override {
    peer_.reset();  // the peer leaves its namespace before the namespace goes
    if (!ns_.empty()) run_quietly(fmt::format("{} link del {}a", kIp, ns_));
  }

  // Starts `kvferry serve` as the other host; returns its handshake endpoint.
  std::string start_peer() {
    cli::ServePeer peer = must(cli::start_serve_peer(
        KVFERRY_CLI_PATH, kPeerBytes, {"--name", "other-host", "--listen", peer_ip_ + ":0"},
        {kIp, "netns", "exec", ns_, kUnshare, "--pid", "--fork", "--kill-child", "--mount-proc"}));
    peer_addr_ = peer.addr;
    peer_.emplace(std::move(peer.process));
    return peer.endpoint;
  }

  std::string ask_peer(const std::string& command) {
    return must(peer_->ask(command, kPeerReplyTimeout));
  }

  std::unique_ptr<TransferEngine> local_engine() {
    EngineOptions options;
    options.name = "this-host";
    options.listen_address = local_ip_ + ":0";
    return must(TransferEngine::create(options));
  }

  testing::NetNamespace netns_;
  std::string ns_;
  std::string local_ip_;
  std::string peer_ip_;
  std::optional<ChildProcess> peer_;
  uint64_t peer_addr_ = 0;
};

TEST_F(TwoHosts, EngineChoosesTcpAndMovesDataBothWays) {
  const std::string peer_endpoint = start_peer();
  const SegmentDescriptor descriptor = must(parse_segment_descriptor(must(fetch_descriptor(
      must(parse_endpoint(peer_endpoint)), Clock::now() + std::chrono::seconds(5)))));
  ASSERT_NE(descriptor.host_id, host_identity()) << "the peer does not look like another host";
  auto engine = local_engine();
  PeerHandle peer = must(engine->open_peer(peer_endpoint));
  ASSERT_EQ(peer.transport(), TransportKind::kTcp)
      << "a peer on another host must be reached over tcp, got "
      << transport_kind_name(peer.transport());

  std::vector<std::byte> local(kPeerBytes);
  ASSERT_TRUE(engine->register_memory(local.data(), local.size()).ok());
  const uint64_t local_addr = reinterpret_cast<uint64_t>(local.data());

  // WRITE: this host's pattern lands on the other host.
  fill_pattern(local, 51);
  TransferOp write{OpKind::kWrite, local_addr, peer_addr_, kPeerBytes};
  ASSERT_TRUE(engine->transfer_sync(peer, {&write, 1}).ok());
  EXPECT_EQ(ask_peer(fmt::format("verify 51 0 {}", kPeerBytes)), "ok");

  // READ: the other host's pattern arrives here.
  ASSERT_EQ(ask_peer(fmt::format("fill 52 0 {}", kPeerBytes)), "ok");
  TransferOp read{OpKind::kRead, local_addr, peer_addr_, kPeerBytes};
  ASSERT_TRUE(engine->transfer_sync(peer, {&read, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(local, 52));
  EXPECT_EQ(ask_peer(fmt::format("checksum 0 {}", kPeerBytes)),
            fmt::format("{:016x}", checksum(local)));
}

TEST_F(TwoHosts, ScatteredSmallWritesLandWhereTheyWereAimed) {
  constexpr uint64_t kPageBytes = 4096;
  constexpr uint64_t kPages = 2048;  // every other page of the first 16 MiB
  const std::string peer_endpoint = start_peer();
  auto engine = local_engine();
  PeerHandle peer = must(engine->open_peer(peer_endpoint));
  ASSERT_EQ(peer.transport(), TransportKind::kTcp);
  ASSERT_EQ(ask_peer(fmt::format("fill 60 0 {}", kPeerBytes)), "ok");

  std::vector<std::byte> source(2 * kPages * kPageBytes);
  fill_pattern(source, 61);
  ASSERT_TRUE(engine->register_memory(source.data(), source.size()).ok());
  std::vector<TransferOp> ops;
  for (uint64_t page = 0; page < kPages; ++page) {
    const uint64_t offset = 2 * page * kPageBytes;
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(source.data()) + offset,
                   peer_addr_ + offset, kPageBytes});
  }
  ASSERT_TRUE(engine->transfer_sync(peer, ops).ok());

  // What the peer's buffer must now hold: its own pattern, with the even pages replaced.
  std::vector<std::byte> expected(kPeerBytes);
  fill_pattern(expected, 60);
  for (uint64_t page = 0; page < kPages; ++page) {
    const uint64_t offset = 2 * page * kPageBytes;
    std::copy_n(source.begin() + static_cast<ptrdiff_t>(offset), kPageBytes,
                expected.begin() + static_cast<ptrdiff_t>(offset));
  }
  EXPECT_EQ(ask_peer(fmt::format("checksum 0 {}", kPeerBytes)),
            fmt::format("{:016x}", checksum(expected)));
}

}  // namespace
}  // namespace kvferry
