// Checks shared by the two-process tests of the same-host routes (shm, cma): this test
// process is the initiator, a `kvferry serve` child the target. The child verifies what
// arrived on its own, from the pattern seed, so a check does not trust the initiator's view
// of the target memory. Each test opens the peer and asserts its route first; these then
// move the bytes over whatever route that is.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry::testing {

// The child's reply to one command line, or the error that replaced it.
inline std::string ask(cli::ServePeer& peer, const std::string& line) {
  auto reply = peer.process.ask(line, std::chrono::seconds(60));
  return reply.ok() ? *reply : reply.status().to_string();
}

// The child's buffer that expect_ten_thousand_scattered_ops_intact needs: twice the ops' bytes.
inline constexpr uint64_t kScatteredOps = 10'000;
inline constexpr uint64_t kScatteredOpBytes = 512;
inline constexpr uint64_t kScatteredOpsTargetBytes = kScatteredOps * kScatteredOpBytes * 2;

// 10,000 WRITEs of 512 bytes into every other slot of the child's buffer, in random order so
// nothing merges; the child changes a few odd slots no op touches; 10,000 READs bring the
// written slots back. Every byte of the target is then checked by the child (written slots,
// its own odd slots, zeros in the odd slots nobody wrote).
inline void expect_ten_thousand_scattered_ops_intact(TransferEngine& engine, PeerHandle handle,
                                                     cli::ServePeer& peer) {
  constexpr uint64_t kOps = kScatteredOps;
  constexpr uint64_t kOpBytes = kScatteredOpBytes;
  constexpr uint64_t kTarget = kScatteredOpsTargetBytes;
  std::vector<uint64_t> perm(kOps);  // op i writes slot perm[i]
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
  ASSERT_TRUE(engine.register_memory(src.data(), src.size()).ok());
  BatchHandle batch = must(engine.submit(handle, ops));
  BatchStatus s = engine.wait(batch, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.ops_submitted, kOps);
  EXPECT_EQ(s.telemetry.ops_posted, kOps);
  EXPECT_EQ(s.telemetry.bytes, kOps * kOpBytes);
  for (uint64_t slot = 1; slot < 2 * kOps; slot += 2000) {
    ASSERT_EQ(ask(peer, fmt::format("fill 12 {} {}", slot * kOpBytes, kOpBytes)), "ok");
  }
  std::vector<std::byte> back(kOps * kOpBytes);
  ASSERT_TRUE(engine.register_memory(back.data(), back.size()).ok());
  std::vector<TransferOp> reads;
  for (uint64_t i = 0; i < kOps; ++i) {
    reads.push_back({OpKind::kRead, reinterpret_cast<uint64_t>(back.data() + i * kOpBytes),
                     peer.addr + perm[i] * kOpBytes, kOpBytes});
  }
  ASSERT_TRUE(engine.transfer_sync(handle, reads).ok());
  for (uint64_t i = 0; i < kOps; ++i) {
    ASSERT_FALSE(
        find_pattern_mismatch({back.data() + i * kOpBytes, kOpBytes}, 11, perm[i] * kOpBytes))
        << "read-back op " << i;
  }
  std::vector<std::byte> expected(kTarget);
  for (uint64_t i = 0; i < kOps; ++i) {
    fill_pattern({expected.data() + perm[i] * kOpBytes, kOpBytes}, 11, perm[i] * kOpBytes);
  }
  for (uint64_t slot = 1; slot < 2 * kOps; slot += 2000) {
    fill_pattern({expected.data() + slot * kOpBytes, kOpBytes}, 12, slot * kOpBytes);
  }
  EXPECT_EQ(ask(peer, fmt::format("checksum 0 {}", kTarget)),
            fmt::format("{:016x}", checksum(expected)));
}

// One WRITE of the child's whole buffer (`bytes`), verified by the child; the child then
// overwrites it with another seed, and one READ brings all of it back.
inline void expect_whole_buffer_write_and_read_intact(TransferEngine& engine, PeerHandle handle,
                                                      cli::ServePeer& peer, uint64_t bytes) {
  std::vector<std::byte> src(bytes);
  fill_pattern(src, 21);
  ASSERT_TRUE(engine.register_memory(src.data(), bytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, bytes};
  ASSERT_TRUE(engine.transfer_sync(handle, {&op, 1}).ok());
  EXPECT_EQ(ask(peer, fmt::format("verify 21 0 {}", bytes)), "ok");
  ASSERT_EQ(ask(peer, fmt::format("fill 22 0 {}", bytes)), "ok");
  op.kind = OpKind::kRead;
  ASSERT_TRUE(engine.transfer_sync(handle, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 22));
}

// Queues 16 WRITEs of `src` (registered, at most the child's buffer) with a 20 s timeout on
// an engine with one worker (seconds of queued and running work), kills the child, and
// expects every batch to end on its own, without help (status polls), completed or
// PeerDisconnected, at least one of them PeerDisconnected, well within 5 s. Returns the op,
// for the caller's check of what a later submit gets.
inline TransferOp expect_killed_peer_ends_queued_writes(TransferEngine& engine, PeerHandle handle,
                                                        cli::ServePeer& peer,
                                                        const std::vector<std::byte>& src) {
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, src.size()};
  SubmitOptions options;
  options.timeout = std::chrono::seconds(20);
  std::vector<BatchHandle> batches;
  for (int i = 0; i < 16; ++i) batches.push_back(must(engine.submit(handle, {&op, 1}, options)));
  peer.process.kill_now();
  const auto t0 = std::chrono::steady_clock::now();
  int disconnected = 0;
  for (const BatchHandle& b : batches) {
    BatchStatus s;
    while ((s = engine.status(b)).state == BatchState::kPending) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
        ADD_FAILURE() << "a batch outlived its timeout";
        return op;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (s.state == BatchState::kFailed) {
      EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
      ++disconnected;
    }
  }
  EXPECT_GT(disconnected, 0) << "every batch finished before the kill was noticed";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  return op;
}

}  // namespace kvferry::testing
