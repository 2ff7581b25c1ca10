// Batches on the local transport (one engine) and on shm between two engines of one
// process (the cross-process case is in tests/integration). Every test checks bytes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::contains;
using testing::make_engine;
using testing::must;

std::vector<std::byte> patterned(size_t bytes, uint64_t seed) {
  std::vector<std::byte> v(bytes);
  fill_pattern(v, seed);
  return v;
}

class LocalTransfer : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = make_engine("local");
    src_ = patterned(kBytes, 7);
    dst_.assign(kBytes, std::byte{0});
    ASSERT_TRUE(engine_->register_memory(src_.data(), kBytes).ok());
    ASSERT_TRUE(engine_->register_memory(dst_.data(), kBytes).ok());
    self_ = must(engine_->open_peer(engine_->endpoint()));
  }
  static constexpr size_t kBytes = 8u << 20;
  std::unique_ptr<TransferEngine> engine_;
  std::vector<std::byte> src_, dst_;
  PeerHandle self_;
};

TEST_F(LocalTransfer, OwnEndpointUsesTheLocalTransport) {
  EXPECT_EQ(self_.transport(), TransportKind::kLocal);
}

TEST_F(LocalTransfer, WriteAndReadMoveExactlyTheBytes) {
  TransferOp write{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 100), 5000};
  ASSERT_TRUE(engine_->transfer_sync(self_, {&write, 1}).ok());
  EXPECT_EQ(std::memcmp(dst_.data() + 100, src_.data(), 5000), 0);
  EXPECT_EQ(dst_[99], std::byte{0});
  EXPECT_EQ(dst_[5100], std::byte{0});
  // READ: local <- remote.
  TransferOp read{OpKind::kRead, addr_of(dst_.data() + 1'000'000), addr_of(src_.data() + 77), 3000};
  ASSERT_TRUE(engine_->transfer_sync(self_, {&read, 1}).ok());
  EXPECT_EQ(std::memcmp(dst_.data() + 1'000'000, src_.data() + 77, 3000), 0);
}

TEST_F(LocalTransfer, LargeBatchSplitAcrossWorkersArrivesWhole) {
  std::vector<TransferOp> ops;
  std::mt19937_64 rng(1);
  for (size_t off = 0; off < kBytes; off += 64 * 1024) {  // reversed order: nothing merges
    ops.push_back({OpKind::kWrite, addr_of(src_.data() + off),
                   addr_of(dst_.data() + (kBytes - 64 * 1024 - off)), 64 * 1024});
  }
  BatchHandle b = must(engine_->submit(self_, ops));
  BatchStatus s = engine_->wait(b, std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.bytes, kBytes);
  for (size_t off = 0; off < kBytes; off += 64 * 1024) {
    ASSERT_EQ(std::memcmp(dst_.data() + (kBytes - 64 * 1024 - off), src_.data() + off, 64 * 1024),
              0);
  }
}

TEST_F(LocalTransfer, LargeBatchesOneAfterAnotherAndAtOnceEachLandWhole) {
  // Large unmerged batches reuse the span storage of those before them: batches of other
  // sizes, some in flight together, each to its own destinations and each checked whole.
  constexpr size_t kOp = 64;
  std::mt19937_64 rng(3);
  size_t at = 0;  // next free destination byte: no two batches write the same bytes
  for (const size_t n : {size_t{3000}, size_t{1200}, size_t{5000}, size_t{2000}, size_t{4000}}) {
    const size_t in_flight = n % 2000 == 0 ? 2 : 1;
    std::vector<std::vector<TransferOp>> batches(in_flight);
    for (auto& ops : batches) {
      for (size_t i = 0; i < n; ++i) {  // reversed, with gaps: nothing merges
        const size_t from = (rng() % (kBytes / kOp)) * kOp;
        ops.push_back({OpKind::kWrite, addr_of(src_.data() + from),
                       addr_of(dst_.data() + at + (n - 1 - i) * 2 * kOp), kOp});
      }
      at += n * 2 * kOp;
    }
    ASSERT_LE(at, kBytes);
    std::vector<BatchHandle> handles;
    for (const auto& ops : batches) handles.push_back(must(engine_->submit(self_, ops)));
    for (size_t b = 0; b < handles.size(); ++b) {
      const BatchStatus s = engine_->wait(handles[b], std::chrono::seconds(10));
      ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
      EXPECT_EQ(s.telemetry.ops_posted, n);
      for (const TransferOp& op : batches[b]) {
        ASSERT_EQ(std::memcmp(reinterpret_cast<const void*>(op.remote_addr),
                              reinterpret_cast<const void*>(op.local_addr), kOp),
                  0)
            << "batch of " << n << ", op to " << op.remote_addr;
      }
    }
  }
}

TEST_F(LocalTransfer, AdjacentOpsMergeOnlyWhenContiguousOnBothSides) {
  std::vector<TransferOp> contiguous, gapped;
  for (uint64_t i = 0; i < 1024; ++i) {
    contiguous.push_back(
        {OpKind::kWrite, addr_of(src_.data()) + i * 4096, addr_of(dst_.data()) + i * 4096, 4096});
    gapped.push_back(
        {OpKind::kWrite, addr_of(src_.data()) + i * 4096, addr_of(dst_.data()) + i * 8192, 4096});
  }
  BatchHandle a = must(engine_->submit(self_, contiguous));
  BatchStatus sa = engine_->wait(a, std::chrono::seconds(10));
  ASSERT_EQ(sa.state, BatchState::kCompleted);
  EXPECT_EQ(sa.telemetry.ops_submitted, 1024u);
  EXPECT_EQ(sa.telemetry.ops_posted, 1u);
  EXPECT_EQ(std::memcmp(dst_.data(), src_.data(), 1024 * 4096), 0);
  BatchHandle g = must(engine_->submit(self_, gapped));
  BatchStatus sg = engine_->wait(g, std::chrono::seconds(10));
  ASSERT_EQ(sg.state, BatchState::kCompleted);
  EXPECT_EQ(sg.telemetry.ops_posted, 1024u);
  EXPECT_EQ(std::memcmp(dst_.data() + 8192 * 1023, src_.data() + 4096 * 1023, 4096), 0);
  EXPECT_GT(sg.telemetry.complete_time.count(), 0);
}

TEST_F(LocalTransfer, InvalidOpAnywhereFailsTheBatchBeforeAByteMoves) {
  std::vector<std::byte> outside(4096);
  std::vector<TransferOp> ops = {
      {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), 4096},
      {OpKind::kWrite, addr_of(outside.data()), addr_of(dst_.data() + 8192), 16}};
  auto r = engine_->submit(self_, ops);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(contains(r.status().message(), fmt::format("{:#x}", addr_of(outside.data()))))
      << r.status().message();
  EXPECT_EQ(dst_[0], std::byte{0}) << "the valid first op must not have run";

  ops[1] = {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + kBytes - 8), 16};
  r = engine_->submit(self_, ops);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(
      contains(r.status().message(), fmt::format("{:#x}", addr_of(dst_.data() + kBytes - 8))));

  ops[1] = {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), 0};
  EXPECT_EQ(engine_->submit(self_, ops).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->submit(self_, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(dst_[0], std::byte{0});
}

TEST_F(LocalTransfer, CancelledBatchWritesNothingAfterCancelReturns) {
  TransferOp op{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), kBytes};
  BatchHandle b = must(engine_->submit(self_, {&op, 1}));
  engine_->cancel(b);
  BatchStatus s = engine_->status(b);
  ASSERT_NE(s.state, BatchState::kPending);
  std::vector<std::byte> after_cancel = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(std::memcmp(after_cancel.data(), dst_.data(), kBytes), 0);
  if (s.state == BatchState::kFailed) {
    EXPECT_EQ(s.status.code(), StatusCode::kCancelled);
  }
}

TEST_F(LocalTransfer, BatchPastItsTimeoutEndsInTimeoutAndStopsWriting) {
  // 64 copies of the source into disjoint pieces of a 512 MiB target (a batch may not write
  // one destination twice): far longer than 1 ms.
  constexpr size_t kCopies = 64;
  std::vector<std::byte> big(kCopies * kBytes, std::byte{0});
  ASSERT_TRUE(engine_->register_memory(big.data(), big.size()).ok());
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kCopies; ++i) {
    ops.push_back({OpKind::kWrite, addr_of(src_.data()), addr_of(big.data() + i * kBytes), kBytes});
  }
  SubmitOptions options;
  options.timeout = std::chrono::milliseconds(1);
  BatchHandle b = must(engine_->submit(self_, ops, options));
  BatchStatus s = engine_->wait(b, std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  std::memset(big.data(), 0, big.size());  // any later copy would show up again
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(std::all_of(big.begin(), big.end(), [](std::byte v) { return v == std::byte{0}; }));
}

TEST_F(LocalTransfer, OverlappingDestinationsAreRefusedNamingBothOps) {
  // Descending order takes the sorting path; op 2 writes into op 0's range.
  std::vector<TransferOp> ops = {
      {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 8192), 4096},
      {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), 4096},
      {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 8192 + 4095), 10},
  };
  auto r = engine_->submit(self_, ops);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(r.status().message(), "ops 0 and 2")) << r.status().message();
  EXPECT_EQ(dst_[8192], std::byte{0}) << "nothing moves";
  // Ascending order, one pass: ops 1 and 2 overlap by one byte.
  ops = {{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), 100},
         {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 100), 100},
         {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 199), 100}};
  r = engine_->submit(self_, ops);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "ops 1 and 2")) << r.status().message();
  // On the engine itself, a READ's destination (local) and a WRITE's (remote) are one
  // memory.
  ops = {{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 5000), 100},
         {OpKind::kRead, addr_of(dst_.data() + 5050), addr_of(src_.data()), 100}};
  r = engine_->submit(self_, ops);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "ops 0 and 1")) << r.status().message();
  // Touching ranges are not overlapping; the same source twice is fine.
  ops = {{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 300), 100},
         {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data() + 200), 100}};
  ASSERT_TRUE(engine_->transfer_sync(self_, ops).ok());
  EXPECT_EQ(std::memcmp(dst_.data() + 200, src_.data(), 100), 0);
  EXPECT_EQ(std::memcmp(dst_.data() + 300, src_.data(), 100), 0);
}

TEST(ShmTransfer, TwoEnginesOnOneHostUseShmAndMoveBytes) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  SharedBuffer target = must(decode->allocate_shared(1 << 20));
  std::vector<std::byte> src = patterned(1 << 20, 99);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  EXPECT_EQ(peer.transport(), TransportKind::kShm);
  EXPECT_EQ(peer.incarnation(), decode->incarnation());
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(target.addr), src.size()};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch({static_cast<std::byte*>(target.addr), src.size()}, 99));
  // READ back into a zeroed local buffer.
  std::fill(src.begin(), src.end(), std::byte{0});
  op.kind = OpKind::kRead;
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 99));
}

// Lines of /proc/self/maps that map a memfd (shared memory handed out by allocate_shared).
size_t memfd_mappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find("/memfd:") != std::string::npos;
  return n;
}

// Mapping a peer's pool costs a page table entry per page (it is mapped populated): only a
// route that copies through it pays that. A peer opened with every route forced to tcp, as
// a peer on another host would be reached, maps nothing; opened plainly, it maps the pool.
TEST(ShmTransfer, APeerForcedToTcpHasItsSharedMemoryLeftUnmapped) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  SharedBuffer target = must(decode->allocate_shared(1 << 20));
  std::vector<std::byte> src = patterned(1 << 20, 98);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  const size_t before = memfd_mappings();
  PeerHandle over_tcp =
      must(prefill->open_peer(decode->endpoint(), {.transport = TransportKind::kTcp}));
  EXPECT_EQ(memfd_mappings(), before);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(target.addr), src.size()};
  ASSERT_TRUE(prefill->transfer_sync(over_tcp, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch({static_cast<std::byte*>(target.addr), src.size()}, 98));
  EXPECT_EQ(memfd_mappings(), before);
  prefill->close_peer(over_tcp);

  PeerHandle over_shm = must(prefill->open_peer(decode->endpoint()));
  EXPECT_EQ(over_shm.transport(), TransportKind::kShm);
  EXPECT_EQ(memfd_mappings(), before + 1);
}

TEST(ShmTransfer, ClosedPeerRefusesOpsUntilOpenedAgain) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  SharedBuffer target = must(decode->allocate_shared(4096));
  std::vector<std::byte> src = patterned(4096, 3);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  prefill->close_peer(peer);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(target.addr), 4096};
  auto r = prefill->submit(peer, {&op, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPeerDisconnected);
  EXPECT_TRUE(contains(r.status().message(), "closed")) << r.status().message();
  EXPECT_EQ(static_cast<std::byte*>(target.addr)[0], std::byte{0});
  PeerHandle reopened = must(prefill->open_peer(decode->endpoint()));
  ASSERT_TRUE(prefill->transfer_sync(reopened, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch({static_cast<std::byte*>(target.addr), 4096}, 3));
}

TEST(ShmTransfer, RegionRegisteredAfterOpenIsFoundByRefreshingTheDescriptor) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  std::vector<std::byte> src = patterned(4096, 5);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  SharedBuffer late = must(decode->allocate_shared(4096));
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(late.addr), 4096};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch({static_cast<std::byte*>(late.addr), 4096}, 5));
}

TEST(TransportChoice, SameHostPeerWithPrivateMemoryIsReachedOverCma) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  std::vector<std::byte> src = patterned(4096, 12), private_dst(4096);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(private_dst.data(), private_dst.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  EXPECT_EQ(peer.transport(), TransportKind::kCma);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(private_dst.data()), 4096};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(private_dst, 12));
}

TEST(ShmTransfer, ForcedShmToNonShareableMemoryIsAnErrorNotAFallback) {
  auto prefill = make_engine("prefill");
  auto decode = make_engine("decode");
  std::vector<std::byte> src(4096), private_dst(4096);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(private_dst.data(), private_dst.size()).ok());
  PeerOptions force_shm;
  force_shm.transport = TransportKind::kShm;
  PeerHandle peer = must(prefill->open_peer(decode->endpoint(), force_shm));
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(private_dst.data()), 4096};
  auto r = prefill->submit(peer, {&op, 1});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(r.status().message(), "not shareable"));
}

TEST(TransportChoice, ImpossibleForcedChoiceIsAnErrorSayingWhy) {
  auto a = make_engine("a");
  PeerOptions force_shm;
  force_shm.transport = TransportKind::kShm;
  auto self = a->open_peer(a->endpoint(), force_shm);
  ASSERT_FALSE(self.ok());
  EXPECT_EQ(self.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(self.status().message(), "itself"));
  auto b = make_engine("b");
  PeerOptions force_local;
  force_local.transport = TransportKind::kLocal;
  auto other = a->open_peer(b->endpoint(), force_local);
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(contains(other.status().message(), "forced transport local"));
  PeerOptions force_rdma;
  force_rdma.transport = TransportKind::kRdma;
  auto rdma = a->open_peer(b->endpoint(), force_rdma);
  ASSERT_FALSE(rdma.ok());
  EXPECT_EQ(rdma.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(rdma.status().message(), "forced transport rdma"))
      << rdma.status().message();
}

TEST(TransportChoice, ShmDisallowedOnOneSideLeavesNoTransport) {
  auto a = make_engine("a");
  EngineOptions o;
  o.name = "shm-disallowed";
  o.allowed_transports = TransportSet{TransportKind::kLocal};  // neither shm nor tcp
  auto b = must(TransferEngine::create(o));
  auto r = a->open_peer(b->endpoint());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(r.status().message(), "peer does not serve it")) << r.status().message();
}

}  // namespace
}  // namespace kvferry
