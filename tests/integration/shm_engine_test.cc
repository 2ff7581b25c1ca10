// The shm transport between two real processes: this test process (initiator) and a
// `kvferry serve` child (target). The child verifies what arrived on its own, from the
// pattern seed, so the check does not trust the initiator's view of the target memory.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <random>
#include <thread>
#include <vector>

#include "core/net.h"
#include "core/pattern.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry {
namespace {

using cli::ServePeer;
using cli::start_serve_peer;
using testing::make_engine;
using testing::must;

constexpr auto kReply = std::chrono::seconds(60);

std::string ask(ServePeer& peer, const std::string& line) {
  auto reply = peer.process.ask(line, kReply);
  return reply.ok() ? *reply : reply.status().to_string();
}

TEST(ShmTwoProcess, TenThousandSmallScatteredWritesAndReadsArriveIntact) {
  constexpr uint64_t kOps = 10'000;
  constexpr uint64_t kOpBytes = 512;
  constexpr uint64_t kTarget = kOps * kOpBytes * 2;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kTarget));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kShm);

  // Op i writes slot perm[i] (every other 512-byte slot), in random order: nothing merges.
  std::vector<uint64_t> perm(kOps);
  for (uint64_t i = 0; i < kOps; ++i) perm[i] = i * 2;
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(42));
  std::vector<std::byte> src(kOps * kOpBytes);
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kOps; ++i) {
    const uint64_t dst_off = perm[i] * kOpBytes;
    fill_pattern({src.data() + i * kOpBytes, kOpBytes}, 11, dst_off);
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data() + i * kOpBytes),
                   peer.addr + dst_off, kOpBytes});
  }
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  BatchHandle batch = must(engine->submit(handle, ops));
  BatchStatus s = engine->wait(batch, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.ops_submitted, kOps);
  EXPECT_EQ(s.telemetry.ops_posted, kOps);
  EXPECT_EQ(s.telemetry.bytes, kOps * kOpBytes);
  // The child checks a sample of slots against the pattern at their own offsets (the
  // checksum at the end covers every byte).
  for (uint64_t i = 0; i < kOps; i += 997) {
    ASSERT_EQ(ask(peer, fmt::format("verify 11 {} {}", perm[i] * kOpBytes, kOpBytes)), "ok");
  }
  // The child changes a few odd slots (seed 12) that no op touches; then 10,000 READs
  // bring the written slots back.
  for (uint64_t slot = 1; slot < 2 * kOps; slot += 2) {
    if (slot % 2000 == 1) {
      ASSERT_EQ(ask(peer, fmt::format("fill 12 {} {}", slot * kOpBytes, kOpBytes)), "ok");
    }
  }
  std::vector<std::byte> back(kOps * kOpBytes);
  ASSERT_TRUE(engine->register_memory(back.data(), back.size()).ok());
  std::vector<TransferOp> reads;
  for (uint64_t i = 0; i < kOps; ++i) {
    reads.push_back({OpKind::kRead, reinterpret_cast<uint64_t>(back.data() + i * kOpBytes),
                     peer.addr + perm[i] * kOpBytes, kOpBytes});
  }
  ASSERT_TRUE(engine->transfer_sync(handle, reads).ok());
  for (uint64_t i = 0; i < kOps; ++i) {
    ASSERT_FALSE(
        find_pattern_mismatch({back.data() + i * kOpBytes, kOpBytes}, 11, perm[i] * kOpBytes))
        << "read-back op " << i;
  }
  // Every written byte, checked by the child in one pass over the even slots' checksums.
  std::vector<std::byte> expected(kTarget);
  for (uint64_t i = 0; i < kOps; ++i) {
    fill_pattern({expected.data() + perm[i] * kOpBytes, kOpBytes}, 11, perm[i] * kOpBytes);
  }
  for (uint64_t slot = 1; slot < 2 * kOps; slot += 2) {
    if (slot % 2000 == 1)
      fill_pattern({expected.data() + slot * kOpBytes, kOpBytes}, 12, slot * kOpBytes);
  }
  EXPECT_EQ(ask(peer, fmt::format("checksum 0 {}", kTarget)),
            fmt::format("{:016x}", checksum(expected)));
}

TEST(ShmTwoProcess, OneGibibyteWriteAndReadArriveIntact) {
  constexpr uint64_t kBytes = 1ull << 30;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 21);
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, kBytes};
  ASSERT_TRUE(engine->transfer_sync(handle, {&op, 1}).ok());
  EXPECT_EQ(ask(peer, fmt::format("verify 21 0 {}", kBytes)), "ok");
  // The child overwrites with another seed; one READ brings all of it back.
  ASSERT_EQ(ask(peer, fmt::format("fill 22 0 {}", kBytes)), "ok");
  op.kind = OpKind::kRead;
  ASSERT_TRUE(engine->transfer_sync(handle, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 22));
}

TEST(ShmTwoProcess, KilledPeerEndsEveryBatchAndLaterSubmitsFailWithPeerDisconnected) {
  constexpr uint64_t kBytes = 256ull << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = make_engine("initiator", 1);
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  std::vector<std::byte> src(kBytes, std::byte{7});
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  // 16 batches of 256 MiB on one worker: seconds of queued and running work.
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, kBytes};
  SubmitOptions options;
  options.timeout = std::chrono::seconds(20);
  std::vector<BatchHandle> batches;
  for (int i = 0; i < 16; ++i) batches.push_back(must(engine->submit(handle, {&op, 1}, options)));
  peer.process.kill_now();
  auto t0 = Clock::now();
  int disconnected = 0;
  for (const BatchHandle& b : batches) {
    // No helping (timeout 0 polls): the engine must end them on its own.
    BatchStatus s;
    while ((s = engine->status(b)).state == BatchState::kPending) {
      ASSERT_LT(Clock::now() - t0, std::chrono::seconds(20)) << "a batch outlived its timeout";
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (s.state == BatchState::kFailed) {
      EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
      ++disconnected;
    }
  }
  EXPECT_GT(disconnected, 0) << "every batch finished before the kill was noticed";
  // Well before the 20 s batch timeout.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  auto later = engine->submit(handle, {&op, 1});
  ASSERT_FALSE(later.ok());
  EXPECT_EQ(later.status().code(), StatusCode::kPeerDisconnected);
  EXPECT_TRUE(testing::contains(later.status().message(), "exited")) << later.status().message();
  // Opening it again finds nobody.
  EXPECT_EQ(engine->open_peer(peer.endpoint).status().code(), StatusCode::kPeerUnreachable);
}

TEST(ShmTwoProcess, RestartedPeerOnTheSameEndpointIsANewIncarnation) {
  ServePeer first = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20));
  auto engine = make_engine("initiator");
  PeerHandle old_handle = must(engine->open_peer(first.endpoint));
  const std::string endpoint = first.endpoint;
  first.process.kill_now();
  ServePeer second = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20, {"--listen", endpoint}));
  // The old handle is dead; open_peer fetches the new incarnation and maps its memory.
  for (int i = 0; i < 200 && !engine->open_peer(endpoint).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  PeerHandle fresh = must(engine->open_peer(endpoint));
  EXPECT_NE(fresh.incarnation(), old_handle.incarnation());
  std::vector<std::byte> src(4096);
  fill_pattern(src, 31);
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), second.addr, 4096};
  EXPECT_EQ(engine->submit(old_handle, {&op, 1}).status().code(), StatusCode::kPeerDisconnected);
  ASSERT_TRUE(engine->transfer_sync(fresh, {&op, 1}).ok());
  EXPECT_EQ(ask(second, "verify 31 0 4096"), "ok");
}

}  // namespace
}  // namespace kvferry
