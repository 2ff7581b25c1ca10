// Peers finding each other through each metadata backend — the embedded p2p handshake,
// a real etcd and a real Redis (started by scripts/services.sh; the tests are skipped,
// not passed, when KVFERRY_TEST_ETCD / KVFERRY_TEST_REDIS are unset) — and moving bytes
// over tcp once found.
#include "metadata/metadata_store.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "core/net.h"
#include "core/pattern.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;

std::string backend_uri(const std::string& which) {
  if (which == "p2p") return "p2p";
  const char* env = std::getenv(which == "etcd" ? "KVFERRY_TEST_ETCD" : "KVFERRY_TEST_REDIS");
  return env != nullptr ? env : "";
}

class MetadataBackends : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    uri_ = backend_uri(GetParam());
    if (uri_.empty()) GTEST_SKIP() << GetParam() << " is not running (see scripts/services.sh)";
  }
  std::unique_ptr<TransferEngine> engine(const std::string& name) {
    EngineOptions o;
    o.name = name;
    o.metadata_uri = uri_;
    o.metadata_ttl = std::chrono::seconds(3);
    o.forced_transport = TransportKind::kTcp;
    return must(TransferEngine::create(o));
  }
  std::string uri_;
};

TEST_P(MetadataBackends, EnginesFindEachOtherAndMoveBytesOverTcp) {
  auto decode = engine("decode");
  auto prefill = engine("prefill");
  constexpr size_t kOps = 10'000, kOpBytes = 128;
  std::vector<std::byte> src(kOps * kOpBytes), dst(kOps * kOpBytes, std::byte{0});
  fill_pattern(src, 61);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  EXPECT_EQ(peer.incarnation(), decode->incarnation());
  std::vector<size_t> order(kOps);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
  std::vector<TransferOp> ops;
  for (size_t i : order) {
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data() + i * kOpBytes),
                   reinterpret_cast<uint64_t>(dst.data() + i * kOpBytes), kOpBytes});
  }
  ASSERT_TRUE(prefill->transfer_sync(peer, ops).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 61));
  // READ it back into a cleared source.
  std::fill(src.begin(), src.end(), std::byte{0});
  for (TransferOp& op : ops) op.kind = OpKind::kRead;
  ASSERT_TRUE(prefill->transfer_sync(peer, ops).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 61));
}

TEST_P(MetadataBackends, OneGibibyteOpArrivesIntact) {
  auto decode = engine("decode");
  auto prefill = engine("prefill");
  constexpr size_t kBytes = 1ull << 30;
  std::vector<std::byte> src(kBytes), dst(kBytes);
  fill_pattern(src, 62);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), kBytes).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.data()), kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 62));
}

// The backends that keep records (p2p keeps none).
class StoredRecords : public MetadataBackends {};

TEST_P(StoredRecords, KilledEnginesRecordVanishesAfterItsTtl) {
  auto peer = must(cli::start_serve_peer(KVFERRY_CLI_PATH, 1 << 20,
                                         {"--metadata", uri_, "--metadata-ttl", "2"}));
  auto store = must(open_metadata_store(uri_, {}));
  auto deadline = [] { return Clock::now() + std::chrono::seconds(2); };
  ASSERT_TRUE(store->fetch(peer.endpoint, deadline()).ok()) << "the record is published";
  peer.process.kill_now();
  auto killed = Clock::now();
  while (store->fetch(peer.endpoint, deadline()).ok()) {
    ASSERT_LT(Clock::now() - killed, std::chrono::seconds(10)) << "record outlived its TTL";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GE(Clock::now() - killed, std::chrono::milliseconds(500)) << "vanished too early?";
  auto engine_view = engine("late");
  auto r = engine_view->open_peer(peer.endpoint);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPeerUnreachable);
}

TEST_P(StoredRecords, CleanShutdownWithdrawsTheRecordAtOnce) {
  std::string endpoint;
  {
    auto e = engine("short-lived");
    endpoint = e->endpoint();
  }
  auto store = must(open_metadata_store(uri_, {}));
  EXPECT_EQ(store->fetch(endpoint, Clock::now() + std::chrono::seconds(2)).status().code(),
            StatusCode::kPeerUnreachable);
}

INSTANTIATE_TEST_SUITE_P(AllBackends, MetadataBackends, ::testing::Values("p2p", "etcd", "redis"),
                         [](const auto& param_info) { return param_info.param; });
INSTANTIATE_TEST_SUITE_P(StoreBackends, StoredRecords, ::testing::Values("etcd", "redis"),
                         [](const auto& param_info) { return param_info.param; });

TEST(MetadataUri, UnknownSchemeNamesTheUriAndTheValidOnes) {
  EngineOptions o;
  o.metadata_uri = "zk://127.0.0.1:2181";
  auto e = TransferEngine::create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::contains(e.status().message(), "zk://127.0.0.1:2181"));
  EXPECT_TRUE(testing::contains(e.status().message(), "etcd://"));
  EXPECT_TRUE(testing::contains(e.status().message(), "redis://"));
}

TEST(MetadataUri, UnreachableStoreIsAnErrorNamingIt) {
  Endpoint closed;
  { auto l = listen_tcp({"127.0.0.1", 0}, &closed); }
  for (const char* scheme : {"etcd", "redis"}) {
    EngineOptions o;
    o.metadata_uri = fmt::format("{}://{}", scheme, closed.to_string());
    o.handshake_timeout = std::chrono::milliseconds(500);
    auto e = TransferEngine::create(o);
    ASSERT_FALSE(e.ok()) << scheme;
    EXPECT_EQ(e.status().code(), StatusCode::kPeerUnreachable) << e.status().to_string();
    EXPECT_TRUE(testing::contains(e.status().message(), o.metadata_uri)) << e.status().message();
  }
  EngineOptions bad;
  bad.metadata_uri = "etcd://nohostport";
  EXPECT_EQ(TransferEngine::create(bad).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvferry
