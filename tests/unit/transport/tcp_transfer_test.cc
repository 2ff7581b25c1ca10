// The tcp transport between engines in one process (loopback), forced where shm would
// otherwise be chosen. Cross-process and failure cases are in tests/integration.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

std::unique_ptr<TransferEngine> engine_with(const std::string& name,
                                            std::optional<std::string> secret = std::nullopt) {
  EngineOptions o;
  o.name = name;
  o.secret = std::move(secret);
  return must(TransferEngine::create(o));
}

PeerHandle open_tcp(TransferEngine& from, const TransferEngine& to) {
  PeerOptions o;
  o.transport = TransportKind::kTcp;
  return must(from.open_peer(to.endpoint(), o));
}

TEST(TcpTransfer, WriteAndReadArriveIntactAcrossLanes) {
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  constexpr size_t kBytes = 40u << 20;  // ten 4 MiB chunks over two lanes
  std::vector<std::byte> src(kBytes), dst(kBytes, std::byte{0});
  fill_pattern(src, 1);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), kBytes).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 1));
  fill_pattern(dst, 2);
  op.kind = OpKind::kRead;
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 2));
}

TEST(TcpTransfer, TenThousandSmallOpsArriveInTheirPlaces) {
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  constexpr size_t kOps = 10'000, kOpBytes = 256;
  std::vector<std::byte> src(kOps * kOpBytes), dst(2 * kOps * kOpBytes, std::byte{0});
  std::vector<size_t> slot(kOps);
  for (size_t i = 0; i < kOps; ++i) slot[i] = 2 * i;
  std::shuffle(slot.begin(), slot.end(), std::mt19937_64(3));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    fill_pattern({src.data() + i * kOpBytes, kOpBytes}, 5, slot[i] * kOpBytes);
    ops.push_back({OpKind::kWrite, addr_of(src.data() + i * kOpBytes),
                   addr_of(dst.data() + slot[i] * kOpBytes), kOpBytes});
  }
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  BatchHandle b = must(prefill->submit(peer, ops));
  BatchStatus s = prefill->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.ops_posted, kOps);
  for (size_t k = 0; k < 2 * kOps; ++k) {
    std::span<const std::byte> piece{dst.data() + k * kOpBytes, kOpBytes};
    if (k % 2 == 0) {
      ASSERT_FALSE(find_pattern_mismatch(piece, 5, k * kOpBytes)) << "slot " << k;
    } else {
      ASSERT_EQ(std::count(piece.begin(), piece.end(), std::byte{0}), kOpBytes) << "slot " << k;
    }
  }
}

TEST(TcpTransfer, ForcedTcpReachesTheEngineItself) {
  auto engine = engine_with("self");
  std::vector<std::byte> a(1 << 20), b(1 << 20, std::byte{0});
  fill_pattern(a, 9);
  ASSERT_TRUE(engine->register_memory(a.data(), a.size()).ok());
  ASSERT_TRUE(engine->register_memory(b.data(), b.size()).ok());
  PeerHandle peer = open_tcp(*engine, *engine);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  TransferOp op{OpKind::kWrite, addr_of(a.data()), addr_of(b.data()), a.size()};
  ASSERT_TRUE(engine->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(b, 9));
}

TEST(TcpTransfer, ReceiverRefusesARangeItNoLongerHasAndWritesNothing) {
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  std::vector<std::byte> src(8192), dst(8192, std::byte{0});
  fill_pattern(src, 4);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);  // caches the descriptor with dst in it
  ASSERT_TRUE(decode->unregister_memory(dst.data()).ok());
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), 8192};
  Status s = prefill->transfer_sync(peer, {&op, 1});
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  EXPECT_EQ(std::count(dst.begin(), dst.end(), std::byte{0}), 8192);
  // The connection survives a refused request.
  std::vector<std::byte> other(8192, std::byte{0});
  ASSERT_TRUE(decode->register_memory(other.data(), other.size()).ok());
  op.remote_addr = addr_of(other.data());
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(other, 4));
}

TEST(TcpAuthentication, MatchingSecretsMoveBytes) {
  auto prefill = engine_with("prefill", "s3cret");
  auto decode = engine_with("decode", "s3cret");
  std::vector<std::byte> src(4096), dst(4096, std::byte{0});
  fill_pattern(src, 8);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), 4096};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 8));
}

TEST(TcpAuthentication, WrongOrMissingSecretIsRefusedAndNothingIsWritten) {
  auto decode = engine_with("decode", "right");
  std::vector<std::byte> dst(4096, std::byte{0});
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  for (std::optional<std::string> secret :
       {std::optional<std::string>("wrong"), std::optional<std::string>()}) {
    auto prefill = engine_with("prefill", secret);
    std::vector<std::byte> src(4096, std::byte{1});
    ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
    // The handshake refuses it the descriptor already (the tcp data plane's own check, for a
    // peer that learned the descriptor elsewhere, is tcp_hostile_test's).
    PeerOptions o;
    o.transport = TransportKind::kTcp;
    auto peer = prefill->open_peer(decode->endpoint(), o);
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), StatusCode::kUnauthenticated) << peer.status().to_string();
    EXPECT_EQ(std::count(dst.begin(), dst.end(), std::byte{0}), 4096);
  }
}

TEST(TransportChoice, ForcedTcpNeedsThePeerToServeIt) {
  auto a = engine_with("a");
  EngineOptions o;
  o.name = "b";
  o.allowed_transports = TransportSet{TransportKind::kLocal, TransportKind::kShm};
  auto b = must(TransferEngine::create(o));
  PeerOptions force;
  force.transport = TransportKind::kTcp;
  auto r = a->open_peer(b->endpoint(), force);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(r.status().message(), "peer does not serve it")) << r.status().message();
}

}  // namespace
}  // namespace kvferry
