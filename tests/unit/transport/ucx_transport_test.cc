// The ucx transport's decisions on this host (UCX without RDMA hardware: tcp, shared memory)
// and an in-process transfer between two engines over UCX's tcp transport. The hardware-RMA
// rows (ucx preferred over tcp) cannot run here; their classification is pinned in
// ucx_resources_test.cc.
#include "transport/ucx/ucx_transport.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <span>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "core/thread_pool.h"
#include "engine/route_choice.h"
#include "kvferry/transfer_engine.h"
#include "mapped_pages.h"
#include "stalled_landing.h"
#include "test_support.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/ucx/ucx_sealed_address.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

constexpr RouteKey kHostToHost{MemoryKind::kHost, MemoryKind::kHost};
constexpr RouteKey kHostToDevice{MemoryKind::kHost, MemoryKind::kDevice};

// UCX restricted to tcp for every test here (and restored after).
class UcxTransportTest : public ::testing::Test {
 protected:
  // Loopback only: integration tests running alongside create and remove veth interfaces.
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);
  }
  void TearDown() override {
    ::unsetenv("UCX_TLS");
    ::unsetenv("UCX_NET_DEVICES");
  }
  TransportEnv env(bool allow_emulated) {
    TransportEnv e;
    e.engine_name = "ucx-unit";
    e.listen_host = "127.0.0.1";
    e.workers = &pool_;
    e.local_regions = [] { return std::make_shared<const RegionIndex>(); };
    e.ucx_allow_emulated = allow_emulated;
    return e;
  }
  static SegmentDescriptor peer_with_ucx(bool hardware_rma) {
    SegmentDescriptor d;
    d.endpoint = "127.0.0.1:9000";
    d.tcp_endpoint = "127.0.0.1:9001";
    d.transports = TransportSet{TransportKind::kTcp, TransportKind::kUcx};
    d.ucx = UcxEndpoint{"address", hardware_rma};
    return d;
  }
  ThreadPool pool_{0};
};

TEST_F(UcxTransportTest, WithoutPermissionEmulatedUcxRefusesEveryRouteSayingWhyAndHow) {
  auto t = must(make_ucx_transport(env(false)));
  const std::string why = t->why_not(kHostToHost, PeerPlace::kOtherHost, peer_with_ucx(false));
  EXPECT_TRUE(contains(why, "only emulated put/get (tcp/")) << why;
  EXPECT_TRUE(contains(why, "KVFERRY_UCX_ALLOW_EMULATED=1")) << why;
  SegmentDescriptor self;
  t->describe(self);
  EXPECT_FALSE(self.ucx.has_value()) << "an inert ucx must not advertise a worker";
  RegionEntry entry;
  std::vector<char> memory(4096);
  entry.addr = reinterpret_cast<uint64_t>(memory.data());
  entry.length = memory.size();
  entry.host_ptr = memory.data();
  ASSERT_TRUE(t->register_region(entry).ok());
  EXPECT_TRUE(entry.ucx_rkey.empty());
}

TEST_F(UcxTransportTest, AllowedEmulationCarriesForcedHostRoutesButNeverWinsOverTcp) {
  auto ucx = must(make_ucx_transport(env(true)));
  auto tcp = must(make_tcp_transport(env(true)));
  const SegmentDescriptor d = peer_with_ucx(false);
  EXPECT_EQ(ucx->why_not(kHostToHost, PeerPlace::kOtherHost, d), "");
  EXPECT_TRUE(contains(ucx->why_not(kHostToDevice, PeerPlace::kOtherHost, d),
                       "ucx moves host memory only"));
  SegmentDescriptor without = d;
  without.ucx.reset();
  EXPECT_EQ(ucx->why_not(kHostToHost, PeerPlace::kOtherHost, without),
            "the peer advertises no ucx worker");
  std::array<const Transport*, kAllTransportKinds.size()> served{};
  served[static_cast<size_t>(TransportKind::kUcx)] = ucx.get();
  served[static_cast<size_t>(TransportKind::kTcp)] = tcp.get();
  detail::RouteChoiceInput input;
  input.served = served;
  input.place = PeerPlace::kOtherHost;
  Route chosen = detail::choose_route(kHostToHost, d, input);
  ASSERT_TRUE(chosen.transport.has_value()) << chosen.reason;
  EXPECT_EQ(*chosen.transport, TransportKind::kTcp) << chosen.reason;
  input.forced = TransportKind::kUcx;
  Route forced = detail::choose_route(kHostToHost, d, input);
  ASSERT_TRUE(forced.transport.has_value()) << forced.reason;
  EXPECT_EQ(*forced.transport, TransportKind::kUcx);
  // Without tcp, the reason ucx did not win is listed.
  served[static_cast<size_t>(TransportKind::kTcp)] = nullptr;
  input.forced.reset();
  Route none = detail::choose_route(kHostToHost, d, input);
  EXPECT_FALSE(none.transport.has_value());
  EXPECT_TRUE(contains(none.reason, "no hardware RMA transport on both sides")) << none.reason;
}

TEST_F(UcxTransportTest, RegistrationPacksAnRkeyAndDescribeAdvertisesTheWorker) {
  auto t = must(make_ucx_transport(env(true)));
  SegmentDescriptor self;
  t->describe(self);
  ASSERT_TRUE(self.ucx.has_value());
  EXPECT_FALSE(self.ucx->worker_address.empty());
  EXPECT_LE(self.ucx->worker_address.size(), kMaxUcxWorkerAddressBytes);
  EXPECT_FALSE(self.ucx->hardware_rma);
  std::vector<char> memory(1 << 20);
  RegionEntry entry;
  entry.addr = reinterpret_cast<uint64_t>(memory.data());
  entry.length = memory.size();
  entry.host_ptr = memory.data();
  ASSERT_TRUE(t->register_region(entry).ok());
  EXPECT_FALSE(entry.ucx_rkey.empty());
  EXPECT_LE(entry.ucx_rkey.size(), kMaxUcxRkeyBytes);
  t->unregister_region(entry);
}

// With a secret, the worker address is advertised sealed, and a peer's address is used only
// when it opens with the same secret for the incarnation it advertises.
TEST_F(UcxTransportTest, ASecretSealsTheWorkerAddressAndRefusesPeersThatCannotProveIt) {
  TransportEnv e = env(true);
  e.secret = "s3cret";
  e.incarnation = 0xabcdef;
  auto t = must(make_ucx_transport(e));
  SegmentDescriptor self;
  t->describe(self);
  ASSERT_TRUE(self.ucx.has_value());
  const std::string& sealed = self.ucx->worker_address;
  ASSERT_TRUE(detail::is_sealed_worker_address(sealed));
  const std::string address = must(detail::open_sealed_worker_address("s3cret", sealed, 0xabcdef));
  EXPECT_EQ(sealed.find(address), std::string::npos) << "the worker address is in the clear";

  SegmentDescriptor peer = peer_with_ucx(false);
  peer.incarnation = 7;
  const std::string unsealed = t->why_not(kHostToHost, PeerPlace::kOtherHost, peer);
  EXPECT_TRUE(contains(unsealed, "has not proved KVFERRY_SECRET")) << unsealed;
  peer.ucx->worker_address = must(detail::seal_worker_address("other", address, 7));
  const std::string wrong = t->why_not(kHostToHost, PeerPlace::kOtherHost, peer);
  EXPECT_TRUE(contains(wrong, "does not open with this engine's secret")) << wrong;
  const std::string name = "127.0.0.1:9000";
  PeerInfo info{peer, name, nullptr};
  Result<std::shared_ptr<TransportLink>> link = t->connect(info);
  ASSERT_FALSE(link.ok());
  EXPECT_EQ(link.status().code(), StatusCode::kUnauthenticated) << link.status().to_string();
  peer.ucx->worker_address = must(detail::seal_worker_address("s3cret", address, 7));
  EXPECT_EQ(t->why_not(kHostToHost, PeerPlace::kOtherHost, peer), "");

  // Without a secret here, a sealed address is refused too (naming the variable).
  auto open = must(make_ucx_transport(env(true)));
  EXPECT_TRUE(contains(open->why_not(kHostToHost, PeerPlace::kOtherHost, peer), "KVFERRY_SECRET"));
}

// The options of an engine with emulated ucx allowed and `secret` set.
EngineOptions emulated_ucx_options(std::string name, std::optional<std::string> secret) {
  EngineOptions o;
  o.name = std::move(name);
  o.ucx_allow_emulated = true;
  o.secret.swap(secret);
  return o;
}

// Two engines over emulated ucx: `local` registered with the initiator, `remote` with the
// target, and the initiator's peer for the target. The caller declares the memory first, so
// the engines that registered it go before it does.
struct UcxPair {
  std::unique_ptr<TransferEngine> target;
  std::unique_ptr<TransferEngine> initiator;
  PeerHandle peer;
};
UcxPair connected_pair(std::span<std::byte> local, std::span<std::byte> remote) {
  UcxPair p;
  p.target = must(TransferEngine::create(emulated_ucx_options("target", std::nullopt)));
  p.initiator = must(TransferEngine::create(emulated_ucx_options("initiator", std::nullopt)));
  EXPECT_TRUE(p.initiator->register_memory(local.data(), local.size()).ok());
  EXPECT_TRUE(p.target->register_memory(remote.data(), remote.size()).ok());
  PeerOptions po;
  po.transport = TransportKind::kUcx;
  p.peer = must(p.initiator->open_peer(p.target->endpoint(), po));
  return p;
}

TEST_F(UcxTransportTest, EnginesSharingASecretMoveBytesAndOneWithoutItIsRefused) {
  EngineOptions o = emulated_ucx_options("target", "s3cret");
  auto target = must(TransferEngine::create(o));
  o.name = "initiator";
  auto initiator = must(TransferEngine::create(o));
  constexpr size_t kBytes = 1 << 20;
  std::vector<std::byte> src(kBytes);
  std::vector<std::byte> dst(kBytes, std::byte{0});
  fill_pattern(src, 23);
  ASSERT_TRUE(initiator->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(target->register_memory(dst.data(), kBytes).ok());
  PeerOptions po;
  po.transport = TransportKind::kUcx;
  PeerHandle peer = must(initiator->open_peer(target->endpoint(), po));
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.data()), kBytes};
  ASSERT_TRUE(initiator->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_EQ(checksum(dst), checksum(src));

  EngineOptions guess = o;
  guess.name = "outsider";
  guess.secret = std::string("guess");
  auto outsider = must(TransferEngine::create(guess));
  auto refused = outsider->open_peer(target->endpoint(), po);
  // The handshake refuses it first (the descriptor is served only with the secret); the
  // sealed worker address covers descriptors read from a metadata store
  // (ASecretSealsTheWorkerAddressAndRefusesPeersThatCannotProveIt).
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().to_string();
}

TEST_F(UcxTransportTest, TwoEnginesInOneProcessMoveBytesBothWays) {
  constexpr size_t kBytes = 3 << 20;
  // Declared first: the engines that registered them go before the memory does.
  std::vector<std::byte> src(kBytes);
  std::vector<std::byte> dst(kBytes, std::byte{0});
  std::vector<std::byte> back(kBytes, std::byte{0});
  auto target = must(TransferEngine::create(emulated_ucx_options("target", std::nullopt)));
  auto initiator = must(TransferEngine::create(emulated_ucx_options("initiator", std::nullopt)));
  fill_pattern(src, 17);
  ASSERT_TRUE(initiator->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(initiator->register_memory(back.data(), kBytes).ok());
  ASSERT_TRUE(target->register_memory(dst.data(), kBytes).ok());
  PeerOptions po;
  po.transport = TransportKind::kUcx;
  PeerHandle peer = must(initiator->open_peer(target->endpoint(), po));
  EXPECT_EQ(peer.transport(), TransportKind::kUcx);
  // Two ops with a gap, so they stay two requests.
  std::vector<TransferOp> ops = {
      {OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
       reinterpret_cast<uint64_t>(dst.data()), kBytes / 2},
      {OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()) + kBytes / 2 + 4096,
       reinterpret_cast<uint64_t>(dst.data()) + kBytes / 2 + 4096, kBytes / 2 - 4096}};
  ASSERT_TRUE(initiator->transfer_sync(peer, ops).ok());
  for (TransferOp& op : ops) {
    op.kind = OpKind::kRead;
    op.local_addr = op.local_addr - reinterpret_cast<uint64_t>(src.data()) +
                    reinterpret_cast<uint64_t>(back.data());
  }
  ASSERT_TRUE(initiator->transfer_sync(peer, ops).ok());
  std::vector<std::byte> expected = src;
  std::fill(expected.begin() + kBytes / 2, expected.begin() + kBytes / 2 + 4096, std::byte{0});
  EXPECT_EQ(checksum(dst), checksum(expected));
  EXPECT_EQ(checksum(back), checksum(expected));
}

// The ucx target's copy of a rendezvous write from its landing buffer stalled mid-copy: a
// wait for landings begun meanwhile returns only after it landed (stalled_landing.h).
TEST_F(UcxTransportTest, AWaitForLandingsBegunWhileACopyIsStalledReturnsOnlyAfterItLanded) {
  std::vector<std::byte> src(1u << 20);  // rendezvous: lands through the target's buffer
  testing::AnonymousPages dst(2 * src.size());
  UcxPair ucx = connected_pair(src, {dst.data(), dst.size()});
  testing::expect_wait_for_landings_outlasts_a_stalled_write(*ucx.initiator, ucx.peer, src, dst);
}

// Small batches are waited for hot: one waiter at a time polls, running the worker's turns,
// the others sleep on their batches. Three threads submit single 4 KiB ops at once, WRITEs and
// READs in turn, and every byte of every op is checked; each batch completes whichever way it was
// waited for.
TEST_F(UcxTransportTest, SmallBatchesWaitedForFromSeveralThreadsAtOnceArriveIntact) {
  constexpr size_t kThreads = 3, kRounds = 60, kBytes = 4096;
  // Declared first: the engines that registered them go before the memory does.
  std::vector<std::byte> local(kThreads * kBytes), remote(kThreads * kBytes);
  UcxPair ucx = connected_pair(local, remote);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::span<std::byte> mine{local.data() + t * kBytes, kBytes};
      std::span<std::byte> theirs{remote.data() + t * kBytes, kBytes};
      for (size_t round = 0; round < kRounds; ++round) {
        const uint64_t seed = 1000 * t + round;
        const OpKind kind = round % 2 == 0 ? OpKind::kWrite : OpKind::kRead;
        fill_pattern(kind == OpKind::kWrite ? mine : theirs, seed);
        TransferOp op{kind, reinterpret_cast<uint64_t>(mine.data()),
                      reinterpret_cast<uint64_t>(theirs.data()), kBytes};
        Status s = ucx.initiator->transfer_sync(ucx.peer, {&op, 1});
        ASSERT_TRUE(s.ok()) << "thread " << t << " round " << round << ": " << s.to_string();
        EXPECT_FALSE(find_pattern_mismatch(kind == OpKind::kWrite ? theirs : mine, seed))
            << "thread " << t << " round " << round;
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

// A small part leaves from the thread that submits it, and its waiter takes in the answer by
// running the worker's turns itself while the progress thread stays parked for the next one.
// A batch whose submitter never waits (a caller that waits on something else) must still end:
// the progress thread takes over, parked or asleep. Each round first waits for a batch (so the
// thread is parked for the next waiter), then submits a WRITE and a READ that nobody waits
// for or polls (wait with no time to wait neither helps nor takes in answers) until they end,
// then one polled through status() alone; every byte of each is checked.
TEST_F(UcxTransportTest, SmallBatchesEndWhetherWaitedForPolledOrNeither) {
  constexpr size_t kBytes = 4096, kRounds = 20;
  std::vector<std::byte> local(3 * kBytes), remote(3 * kBytes);
  UcxPair ucx = connected_pair(local, remote);
  TransferEngine& initiator = *ucx.initiator;
  const PeerHandle& peer = ucx.peer;
  auto op = [&](OpKind kind, size_t slot) {
    return TransferOp{kind, reinterpret_cast<uint64_t>(local.data() + slot * kBytes),
                      reinterpret_cast<uint64_t>(remote.data() + slot * kBytes), kBytes};
  };
  auto mine = [&](size_t slot) {
    return std::span<std::byte>(local.data() + slot * kBytes, kBytes);
  };
  auto theirs = [&](size_t slot) {
    return std::span<std::byte>(remote.data() + slot * kBytes, kBytes);
  };
  // Until the batch ends or its own timeout has long passed (a hang fails here, not in CI's
  // limit); `poll` asks status(), which takes in answers, instead of the bare state.
  auto ended = [&](const BatchHandle& h, bool poll) {
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    BatchStatus s;
    do {
      s = poll ? initiator.status(h) : initiator.wait(h, std::chrono::milliseconds(0));
      if (s.state != BatchState::kPending) return s;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    } while (Clock::now() < give_up);
    return s;
  };
  for (size_t round = 0; round < kRounds; ++round) {
    const uint64_t seed = 10 * round;
    fill_pattern(mine(0), seed);
    TransferOp waited = op(OpKind::kWrite, 0);
    ASSERT_TRUE(initiator.transfer_sync(peer, {&waited, 1}).ok()) << "round " << round;
    fill_pattern(mine(1), seed + 1);
    fill_pattern(theirs(2), seed + 2);
    TransferOp write = op(OpKind::kWrite, 1);
    TransferOp read = op(OpKind::kRead, 2);
    BatchHandle w = must(initiator.submit(peer, {&write, 1}));
    BatchHandle r = must(initiator.submit(peer, {&read, 1}));
    BatchStatus ws = ended(w, false);
    BatchStatus rs = ended(r, false);
    ASSERT_EQ(ws.state, BatchState::kCompleted)
        << "round " << round << ": " << ws.status.to_string();
    ASSERT_EQ(rs.state, BatchState::kCompleted)
        << "round " << round << ": " << rs.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(theirs(0), seed)) << "round " << round;
    EXPECT_FALSE(find_pattern_mismatch(theirs(1), seed + 1)) << "round " << round;
    EXPECT_FALSE(find_pattern_mismatch(mine(2), seed + 2)) << "round " << round;
    fill_pattern(mine(1), seed + 3);
    BatchHandle polled = must(initiator.submit(peer, {&write, 1}));
    BatchStatus ps = ended(polled, true);
    ASSERT_EQ(ps.state, BatchState::kCompleted)
        << "round " << round << ": " << ps.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(theirs(1), seed + 3)) << "round " << round;
  }
}

TEST_F(UcxTransportTest, ForcingUcxWithoutPermissionFailsOpenPeerNamingTheSwitch) {
  EngineOptions o;
  o.name = "target";
  auto target = must(TransferEngine::create(o));
  o.name = "initiator";
  auto initiator = must(TransferEngine::create(o));
  std::vector<std::byte> dst(4096);
  ASSERT_TRUE(target->register_memory(dst.data(), dst.size()).ok());
  PeerOptions po;
  po.transport = TransportKind::kUcx;
  auto peer = initiator->open_peer(target->endpoint(), po);
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), StatusCode::kNotSupported) << peer.status().to_string();
  EXPECT_TRUE(contains(peer.status().message(), "KVFERRY_UCX_ALLOW_EMULATED"))
      << peer.status().to_string();
}

}  // namespace
}  // namespace kvferry
