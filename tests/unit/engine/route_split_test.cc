// Routes per op through the engine: a batch split across transports, refused ops, forced
// transports, and transports that tests plug in without touching the engine. The test
// transports below live in this file only (engine/engine_impl.h's create_engine seam).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/pattern.h"
#include "engine/engine_impl.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::contains;
using testing::must;

// What a test transport does with the parts it is given.
struct Script {
  Status post_error;  // returned by post(): the part never starts
  Status task_error;  // the part's one task ends with it
  int posts = 0;
  uint64_t bytes = 0;
};

// A transport for both engines of one test process: the peer's memory is this process's
// memory, so it copies with memcpy at the remote address. `device` makes it the device
// transport (it reaches device regions, which in these tests are host memory labelled
// cuda:0); otherwise it carries host memory.
class TestTransport final : public Transport {
 public:
  TestTransport(TransportKind kind, bool device, Script& script)
      : kind_(kind), device_(device), script_(script) {}

  TransportKind kind() const override { return kind_; }
  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.access = device_ ? CopyAccess::kDevicePointers : CopyAccess::kRemoteAddress;
    caps.reaches_local_device = device_;
    return caps;
  }
  Status prepare_region(RegionEntry& entry) override {
    entry.cuda = CudaIpcBacking{{}, 0, entry.length};
    return Status::Ok();
  }
  std::string why_not(RouteKey key, PeerPlace place, const SegmentDescriptor&) const override {
    if (place == PeerPlace::kOtherHost) return "the test transport stays on one host";
    const bool touches_device =
        key.local == MemoryKind::kDevice || key.remote == MemoryKind::kDevice;
    if (device_ != touches_device) return device_ ? "no device memory" : "host memory only";
    return "";
  }
  Result<std::shared_ptr<TransportLink>> connect(const PeerInfo&) override {
    return std::shared_ptr<TransportLink>(std::make_shared<Link>(script_));
  }

 private:
  class Link final : public TransportLink {
   public:
    explicit Link(Script& script) : script_(script) {}
    Status post(const BatchPart& part) override {
      ++script_.posts;
      if (!script_.post_error.ok()) return script_.post_error;
      part.batch->add_tasks(1);
      part.batch->mark_posted();
      Status outcome = script_.task_error;
      if (outcome.ok()) {
        auto guard = part.batch->copying();
        outcome = part.batch->stop_reason();
        for (const ResolvedOp& op : part.spans) {
          if (!outcome.ok()) break;
          auto* remote = reinterpret_cast<char*>(op.remote_addr);
          if (op.kind == OpKind::kWrite) {
            std::memcpy(remote, op.local, op.length);
          } else {
            std::memcpy(op.local, remote, op.length);
          }
          script_.bytes += op.length;
        }
      }
      part.batch->finish_task(outcome);
      return Status::Ok();
    }

   private:
    Script& script_;
  };

  TransportKind kind_;
  bool device_;
  Script& script_;
};

// The build's transports, with `kind` replaced by (or joined by) a test transport.
std::vector<BuiltTransport> with_test_transport(TransportKind kind, bool device, Script& script) {
  std::vector<BuiltTransport> out;
  for (BuiltTransport& t : built_transports()) {
    if (t.kind != kind) out.push_back(std::move(t));
  }
  out.push_back({kind, [kind, device, &script](const TransportEnv&) {
                   return Result<std::unique_ptr<Transport>>(
                       std::make_unique<TestTransport>(kind, device, script));
                 }});
  return out;
}

std::unique_ptr<TransferEngine> engine_with(const std::string& name,
                                            std::vector<BuiltTransport> transports,
                                            TransportSet allowed = {}) {
  EngineOptions options;
  options.name = name;
  options.allowed_transports = allowed;
  return must(detail::EngineImpl::create_engine(options, std::move(transports)));
}

bool all_zero(std::span<const std::byte> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](std::byte b) { return b == std::byte{0}; });
}

// Decode has shared host memory (reached over shm) and "device" memory (reached over the
// test device transport, standing in for cuda_ipc); prefill writes both in one batch.
class SplitBatch : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 64 << 10;
  void SetUp() override {
    decode_ = engine_with("decode", with_test_transport(TransportKind::kCudaIpc, true, device_));
    prefill_ = engine_with("prefill", with_test_transport(TransportKind::kCudaIpc, true, device_));
    shared_ = must(decode_->allocate_shared(kBytes));
    std::memset(shared_.addr, 0, kBytes);
    device_memory_.assign(kBytes, std::byte{0});
    ASSERT_TRUE(
        decode_->register_memory(device_memory_.data(), kBytes, {MemoryLocation::Kind::kCuda, 0})
            .ok());
    src_.resize(2 * kBytes);
    fill_pattern(src_, 41);
    ASSERT_TRUE(prefill_->register_memory(src_.data(), src_.size()).ok());
    peer_ = must(prefill_->open_peer(decode_->endpoint()));
  }
  std::span<const std::byte> shared() const {
    return {static_cast<const std::byte*>(shared_.addr), kBytes};
  }
  // Interleaved: host rows and device pages alternate, as sglang's aux and KV writes do.
  std::vector<TransferOp> interleaved_ops() const {
    std::vector<TransferOp> ops;
    constexpr size_t kPiece = kBytes / 4;
    for (size_t i = 0; i < 4; ++i) {
      ops.push_back({OpKind::kWrite, addr_of(src_.data() + i * kPiece),
                     addr_of(static_cast<char*>(shared_.addr) + i * kPiece), kPiece});
      ops.push_back({OpKind::kWrite, addr_of(src_.data() + kBytes + i * kPiece),
                     addr_of(device_memory_.data() + i * kPiece), kPiece});
    }
    return ops;
  }

  Script device_;
  std::unique_ptr<TransferEngine> decode_;
  std::unique_ptr<TransferEngine> prefill_;
  SharedBuffer shared_;
  std::vector<std::byte> device_memory_;
  std::vector<std::byte> src_;
  PeerHandle peer_;
};

TEST_F(SplitBatch, OneBatchGoesOverTwoRoutesAndEveryByteLands) {
  std::vector<TransferOp> ops = interleaved_ops();
  BatchHandle batch = must(prefill_->submit(peer_, ops));
  BatchStatus done = prefill_->wait(batch, std::chrono::seconds(10));
  ASSERT_EQ(done.state, BatchState::kCompleted) << done.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(shared(), 41));
  EXPECT_FALSE(find_pattern_mismatch(device_memory_, 41, kBytes));
  EXPECT_EQ(device_.posts, 1);
  EXPECT_EQ(device_.bytes, kBytes);
  // Four ops per route, contiguous on both sides: one span per part.
  EXPECT_EQ(done.telemetry.ops_submitted, 8u);
  EXPECT_EQ(done.telemetry.ops_posted, 2u);
  EXPECT_EQ(done.telemetry.bytes, 2 * kBytes);
}

TEST_F(SplitBatch, EachRouteIsChosenOnceAndCanBeQueried) {
  std::vector<Route> routes = peer_.routes();
  auto find = [&](MemoryKind local, MemoryKind remote) {
    for (const Route& r : routes) {
      if (r.local == local && r.remote == remote) return r;
    }
    return Route{};
  };
  EXPECT_EQ(find(MemoryKind::kHost, MemoryKind::kDevice).transport, TransportKind::kCudaIpc);
  EXPECT_EQ(find(MemoryKind::kHost, MemoryKind::kSharedHost).transport, TransportKind::kShm);
  EXPECT_EQ(find(MemoryKind::kHost, MemoryKind::kHost).transport, TransportKind::kCma);
  EXPECT_EQ(peer_.transport(), TransportKind::kCudaIpc);  // it advertises device memory
}

TEST_F(SplitBatch, TheFirstFailureWinsAndTheOtherPartStillEnds) {
  device_.task_error = Internal("scripted device failure");
  std::vector<TransferOp> ops = interleaved_ops();
  BatchHandle batch = must(prefill_->submit(peer_, ops));
  BatchStatus done = prefill_->wait(batch, std::chrono::seconds(10));
  ASSERT_EQ(done.state, BatchState::kFailed);
  EXPECT_EQ(done.status.code(), StatusCode::kInternal);
  EXPECT_TRUE(contains(done.status.message(), "scripted device failure")) << done.status.message();
  EXPECT_FALSE(find_pattern_mismatch(shared(), 41));  // the shm part completed
  EXPECT_TRUE(all_zero(device_memory_));
}

TEST_F(SplitBatch, APartThatCannotStartStopsTheBatchBeforeAnyByteMoves) {
  device_.post_error = PeerUnreachable("scripted: the device link cannot open");
  std::vector<TransferOp> ops = interleaved_ops();
  Result<BatchHandle> batch = prefill_->submit(peer_, ops);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kPeerUnreachable);
  // The memcpy part is posted last: it never ran.
  EXPECT_TRUE(all_zero(shared()));
  // Nothing stays pinned: the source can be unregistered at once.
  EXPECT_TRUE(prefill_->unregister_memory(src_.data()).ok());
}

TEST_F(SplitBatch, ForcedTransportThatCannotCarryOneOpRefusesTheWholeBatch) {
  PeerOptions force_shm;
  force_shm.transport = TransportKind::kShm;
  PeerHandle forced = must(prefill_->open_peer(decode_->endpoint(), force_shm));
  std::vector<TransferOp> ops = interleaved_ops();
  Result<BatchHandle> batch = prefill_->submit(forced, ops);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(batch.status().message(), "op 1 ")) << batch.status().message();
  EXPECT_TRUE(contains(batch.status().message(),
                       "forced transport shm cannot carry host memory to the peer's device memory"))
      << batch.status().message();
  EXPECT_TRUE(all_zero(shared()));
  EXPECT_EQ(device_.posts, 0);
}

TEST(RoutePerOp, ADeviceOpNoTransportReachesIsRefusedBeforeAnyByteMoves) {
  Script device;
  auto decode = engine_with("decode", with_test_transport(TransportKind::kCudaIpc, true, device));
  // Prefill serves no transport that reaches device memory (tcp would stage it).
  auto prefill = engine_with("prefill", built_transports(),
                             TransportSet{TransportKind::kLocal, TransportKind::kShm});
  constexpr size_t kBytes = 4096;
  SharedBuffer shared = must(decode->allocate_shared(kBytes));
  std::memset(shared.addr, 0, kBytes);
  std::vector<std::byte> device_memory(kBytes);
  ASSERT_TRUE(
      decode->register_memory(device_memory.data(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  std::vector<std::byte> src(2 * kBytes);
  fill_pattern(src, 5);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  std::vector<TransferOp> ops = {
      {OpKind::kWrite, addr_of(src.data()), addr_of(shared.addr), kBytes},
      {OpKind::kWrite, addr_of(src.data() + kBytes), addr_of(device_memory.data()), kBytes}};
  Result<BatchHandle> batch = prefill->submit(peer, ops);
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kNotSupported);
  const std::string& why = batch.status().message();
  EXPECT_TRUE(contains(why, "op 1 ")) << why;
  EXPECT_TRUE(contains(why, "no transport carries host memory to the peer's device memory")) << why;
  EXPECT_TRUE(contains(why, "cuda_ipc: this engine does not serve it")) << why;
  EXPECT_TRUE(contains(why, "tcp: this engine does not serve it")) << why;
  EXPECT_TRUE(all_zero({static_cast<const std::byte*>(shared.addr), kBytes}));
  EXPECT_EQ(device.posts, 0);
}

TEST(RoutePerOp, ANewTransportKindPlugsInWithoutEngineChanges) {
  // Both engines serve only local and a test transport of a kind no built transport has.
  Script script;
  const TransportSet allowed{TransportKind::kLocal, TransportKind::kRdma};
  auto decode =
      engine_with("decode", with_test_transport(TransportKind::kRdma, false, script), allowed);
  auto prefill =
      engine_with("prefill", with_test_transport(TransportKind::kRdma, false, script), allowed);
  constexpr size_t kBytes = 1 << 20;
  std::vector<std::byte> src(kBytes), dst(kBytes);
  fill_pattern(src, 9);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), kBytes).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  EXPECT_EQ(peer.transport(), TransportKind::kRdma);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 9));
  EXPECT_EQ(script.posts, 1);
}

}  // namespace
}  // namespace kvferry
