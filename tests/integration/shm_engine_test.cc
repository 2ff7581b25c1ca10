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
#include "serve_peer_checks.h"
#include "test_support.h"

namespace kvferry {
namespace {

using cli::ServePeer;
using cli::start_serve_peer;
using testing::ask;
using testing::make_engine;
using testing::must;

TEST(ShmTwoProcess, TenThousandSmallScatteredWritesAndReadsArriveIntact) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, testing::kScatteredOpsTargetBytes));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kShm);
  testing::expect_ten_thousand_scattered_ops_intact(*engine, handle, peer);
}

TEST(ShmTwoProcess, OneGibibyteWriteAndReadArriveIntact) {
  constexpr uint64_t kBytes = 1ull << 30;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kShm);
  testing::expect_whole_buffer_write_and_read_intact(*engine, handle, peer, kBytes);
}

TEST(ShmTwoProcess, KilledPeerEndsEveryBatchAndLaterSubmitsFailWithPeerDisconnected) {
  constexpr uint64_t kBytes = 256ull << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = make_engine("initiator", 1);
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  std::vector<std::byte> src(kBytes, std::byte{7});
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  const TransferOp op = testing::expect_killed_peer_ends_queued_writes(*engine, handle, peer, src);
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
