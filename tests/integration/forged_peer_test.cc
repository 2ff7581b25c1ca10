// Attack class: a forged segment descriptor (confused deputy). A process of another user
// (uid 65534, no kvferry, no secret) runs a fake handshake server whose descriptor names a
// third process — a root child holding pages shared with this test — or this engine's own
// pid, with addresses nobody registered. It even listens on abstract sockets named like an
// engine's cma and shm sockets. A root engine that opens it must refuse, over every route
// (auto, forced cma, forced shm), and no byte may reach the third process or the engine's
// own unregistered memory. The same forged descriptor put straight into etcd or Redis by a
// client with only store access fares no better, with a secret (unsigned record) or without
// (the cma identity check).
#include "forged_peer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <vector>

#include "metadata/metadata_store.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::FakeHandshakeServer;
using testing::forged_descriptor;
using testing::kPage;
using testing::must;
using testing::SharedPages;
using testing::Victim;

// Opens `name` with each route and, should an open ever succeed, writes and reads its two
// regions: the outcome that matters is that no byte moved.
void expect_every_route_refused(TransferEngine& engine, const std::string& name, uint64_t page0,
                                uint64_t page1, StatusCode expected) {
  std::vector<std::byte> src(kPage, std::byte{0x66});
  ASSERT_TRUE(engine.register_memory(src.data(), src.size()).ok());
  for (std::optional<TransportKind> route :
       {std::optional<TransportKind>(), std::optional<TransportKind>(TransportKind::kCma),
        std::optional<TransportKind>(TransportKind::kShm)}) {
    SCOPED_TRACE(route ? transport_kind_name(*route) : "auto");
    PeerOptions options;
    options.transport = route;
    Result<PeerHandle> peer = engine.open_peer(name, options);
    EXPECT_FALSE(peer.ok());
    if (peer.ok()) {
      for (uint64_t page : {page0, page1}) {
        for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
          TransferOp op{kind, reinterpret_cast<uint64_t>(src.data()), page, kPage};
          engine.transfer_sync(*peer, {&op, 1}).ignore();
        }
      }
      continue;
    }
    EXPECT_EQ(peer.status().code(), expected) << peer.status().to_string();
  }
  ASSERT_TRUE(engine.unregister_memory(src.data()).ok());
}

class ForgedDescriptor : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the attacker as another uid";
  }
  std::string sockets_ = "forged-" + std::to_string(::getpid());
};

TEST_F(ForgedDescriptor, AFakeHandshakeServerCannotSteerARootEngineIntoAThirdProcess) {
  Victim victim;
  FakeHandshakeServer fake(sockets_ + "-v",
                           forged_descriptor("127.0.0.1:1", victim.pid, victim.pages.addr(0),
                                             victim.pages.addr(1), sockets_ + "-v"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator");
  expect_every_route_refused(*engine, fake.endpoint(), victim.pages.addr(0), victim.pages.addr(1),
                             StatusCode::kUnauthenticated);
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

TEST_F(ForgedDescriptor, AFakeHandshakeServerCannotSteerAnEngineIntoItsOwnUnregisteredMemory) {
  SharedPages own;  // this process's memory, registered nowhere
  FakeHandshakeServer fake(
      sockets_ + "-s",
      forged_descriptor("127.0.0.1:1", ::getpid(), own.addr(0), own.addr(1), sockets_ + "-s"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator");
  expect_every_route_refused(*engine, fake.endpoint(), own.addr(0), own.addr(1),
                             StatusCode::kUnauthenticated);
  EXPECT_TRUE(own.untouched()) << "bytes reached this engine's unregistered memory";
}

TEST_F(ForgedDescriptor, AnEngineWithASecretRefusesADescriptorServedWithoutAChallenge) {
  Victim victim;
  FakeHandshakeServer fake(sockets_ + "-k",
                           forged_descriptor("127.0.0.1:1", victim.pid, victim.pages.addr(0),
                                             victim.pages.addr(1), sockets_ + "-k"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator", 2, "engine-secret");
  expect_every_route_refused(*engine, fake.endpoint(), victim.pages.addr(0), victim.pages.addr(1),
                             StatusCode::kUnauthenticated);
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

// A record put under a made-up name by a client with only store access.
class ForgedStoreRecord : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const char* env =
        std::getenv(GetParam() == "etcd" ? "KVFERRY_TEST_ETCD" : "KVFERRY_TEST_REDIS");
    if (env == nullptr) GTEST_SKIP() << GetParam() << " is not running (scripts/services.sh)";
    uri_ = env;
  }
  std::unique_ptr<TransferEngine> engine(std::optional<std::string> secret) {
    EngineOptions o;
    o.name = "root-initiator";
    o.metadata_uri = uri_;
    o.secret = std::move(secret);
    return must(TransferEngine::create(o));
  }
  std::string uri_;
};

TEST_P(ForgedStoreRecord, IsRefusedWithAndWithoutASecretAndNoByteReachesTheVictim) {
  Victim victim;
  const std::string name = "127.0.0.9:" + std::to_string(20000 + ::getpid() % 20000);
  const std::string sockets = "forged-store-" + std::to_string(::getpid());
  const SegmentDescriptor forged =
      forged_descriptor(name, victim.pid, victim.pages.addr(0), victim.pages.addr(1), sockets);
  FakeHandshakeServer sockets_only(sockets, forged);  // serves the named abstract sockets
  ASSERT_EQ(sockets_only.ready(), "ready");
  auto writer = must(open_metadata_store(uri_, MetadataStoreOptions{}));
  ASSERT_TRUE(writer->publish(name, serialize_segment_descriptor(forged)).ok());
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("store-secret")}) {
    SCOPED_TRACE(secret ? "with a secret" : "without a secret");
    auto e = engine(secret);
    expect_every_route_refused(*e, name, victim.pages.addr(0), victim.pages.addr(1),
                               StatusCode::kUnauthenticated);
  }
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

INSTANTIATE_TEST_SUITE_P(Stores, ForgedStoreRecord, ::testing::Values("etcd", "redis"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace kvferry
