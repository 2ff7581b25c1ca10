// The ucx transport between two processes over UCX's tcp transport (UCX_TLS=tcp, emulation
// explicitly allowed on both sides, so bytes move as kvferry's active messages): bytes
// verified by the `kvferry serve` child, and the failure cases — a range outside the peer's
// regions, a killed peer, a stopped peer (whose timed-out batch lands nothing after it
// resumes), a restarted one. Without UCX in the build these tests are not compiled.
#ifdef KVFERRY_WITH_UCX
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <vector>

#include "core/net.h"
#include "core/pattern.h"
#include "serve_client.h"
#include "test_support.h"
#include "transport/ucx/ucx_am_wire.h"

namespace kvferry {
namespace {

using cli::ServePeer;
using cli::start_serve_peer;
using testing::must;

// Every engine of the test (and the serve children, which inherit the environment) uses
// UCX's tcp transport with emulated paths allowed (bytes move as active messages), on
// loopback only: other tests create veth interfaces that come and go, and a UCX worker
// advertises every interface it saw at start, so a peer could be dialled on a gone one.
class UcxTwoProcess : public ::testing::Test {
 protected:
  void SetUp() override {
    ::setenv("UCX_TLS", "tcp", 1);
    ::setenv("UCX_NET_DEVICES", "lo", 1);
    ::setenv("KVFERRY_UCX_ALLOW_EMULATED", "1", 1);
  }
  void TearDown() override {
    ::unsetenv("UCX_TLS");
    ::unsetenv("UCX_NET_DEVICES");
    ::unsetenv("KVFERRY_UCX_ALLOW_EMULATED");
  }
  static std::unique_ptr<TransferEngine> initiator() {
    EngineOptions o;
    o.name = "initiator";
    o.ucx_allow_emulated = true;
    return must(TransferEngine::create(o));
  }
  static PeerHandle open_ucx(TransferEngine& engine, const std::string& endpoint) {
    PeerOptions o;
    o.transport = TransportKind::kUcx;
    return must(engine.open_peer(endpoint, o));
  }
  static std::string ask(ServePeer& peer, const std::string& line) {
    return must(peer.process.ask(line, std::chrono::seconds(60)));
  }
};

TEST_F(UcxTwoProcess, OneGibibyteWriteAndReadArriveIntact) {
  constexpr uint64_t kBytes = 1ull << 30;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  EXPECT_EQ(handle.transport(), TransportKind::kUcx);
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 41);
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, kBytes};
  SubmitOptions options;
  options.timeout = std::chrono::seconds(120);
  BatchHandle write = must(engine->submit(handle, {&op, 1}, options));
  BatchStatus ws = engine->wait(write, std::chrono::seconds(150));
  ASSERT_EQ(ws.state, BatchState::kCompleted) << ws.status.to_string();
  EXPECT_EQ(ask(peer, fmt::format("verify 41 0 {}", kBytes)), "ok");
  ASSERT_EQ(ask(peer, fmt::format("fill 42 0 {}", kBytes)), "ok");
  op.kind = OpKind::kRead;
  BatchHandle read = must(engine->submit(handle, {&op, 1}, options));
  BatchStatus rs = engine->wait(read, std::chrono::seconds(150));
  ASSERT_EQ(rs.state, BatchState::kCompleted) << rs.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(src, 42));
}

TEST_F(UcxTwoProcess, TenThousandSmallOpsWriteAndReadArriveIntact) {
  constexpr uint64_t kOps = 10'000;
  constexpr uint64_t kOpBytes = 512;
  constexpr uint64_t kStride = 1024;  // gaps keep the engine from merging neighbours
  constexpr uint64_t kBytes = kOps * kStride;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 51);
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  ASSERT_EQ(ask(peer, fmt::format("fill 7 0 {}", kBytes)), "ok");
  std::vector<TransferOp> ops;
  for (uint64_t i = 0; i < kOps; ++i) {
    // Op i writes source slot i into the peer's slot kOps-1-i: every op has its own place.
    const uint64_t src_off = i * kStride;
    const uint64_t dst_off = (kOps - 1 - i) * kStride;
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()) + src_off,
                   peer.addr + dst_off, kOpBytes});
  }
  ASSERT_TRUE(engine->transfer_sync(handle, ops).ok());
  // Read everything back into a fresh buffer and compare with what was written where.
  std::vector<std::byte> back(kBytes);
  ASSERT_TRUE(engine->register_memory(back.data(), kBytes).ok());
  TransferOp whole{OpKind::kRead, reinterpret_cast<uint64_t>(back.data()), peer.addr, kBytes};
  ASSERT_TRUE(engine->transfer_sync(handle, {&whole, 1}).ok());
  std::vector<std::byte> expected(kBytes);
  fill_pattern(expected, 7);
  for (uint64_t i = 0; i < kOps; ++i) {
    std::copy_n(src.begin() + static_cast<ptrdiff_t>(i * kStride), kOpBytes,
                expected.begin() + static_cast<ptrdiff_t>((kOps - 1 - i) * kStride));
  }
  ASSERT_EQ(checksum(back), checksum(expected));
  // And a 10,000-op READ batch: slot i of the peer into slot i of a second buffer.
  std::vector<std::byte> dst(kBytes, std::byte{0});
  ASSERT_TRUE(engine->register_memory(dst.data(), kBytes).ok());
  for (uint64_t i = 0; i < kOps; ++i) {
    ops[i] = {OpKind::kRead, reinterpret_cast<uint64_t>(dst.data()) + i * kStride,
              peer.addr + i * kStride, kOpBytes};
  }
  ASSERT_TRUE(engine->transfer_sync(handle, ops).ok());
  for (uint64_t i = 0; i < kOps; ++i) {
    const auto at = static_cast<ptrdiff_t>(i * kStride);
    ASSERT_TRUE(std::equal(dst.begin() + at, dst.begin() + at + kOpBytes, expected.begin() + at))
        << "slot " << i;
  }
}

// Payloads up to kUcxAmEagerMaxBytes are sent eager (UCX assembles their fragments), larger
// ones by rendezvous (into the worker's landing buffers): ops of sizes on both sides of the
// limit, and odd ones, land whole and in their own places, written and read back.
TEST_F(UcxTwoProcess, OpsOnBothSidesOfTheEagerLimitArriveIntactBothWays) {
  constexpr uint64_t kLimit = detail::kUcxAmEagerMaxBytes;
  const std::vector<uint64_t> sizes = {1,      4093,       (64 << 10) + 3, kLimit - 1,
                                       kLimit, kLimit + 1, 2 * kLimit + 7};
  constexpr uint64_t kStride = 4 * kLimit;  // no two ops merge
  const uint64_t bytes = sizes.size() * kStride;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, bytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> src(bytes);
  fill_pattern(src, 61);
  ASSERT_TRUE(engine->register_memory(src.data(), bytes).ok());
  ASSERT_EQ(ask(peer, fmt::format("fill 62 0 {}", bytes)), "ok");
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()) + i * kStride,
                   peer.addr + i * kStride, sizes[i]});
  }
  ASSERT_TRUE(engine->transfer_sync(handle, ops).ok());
  // The peer's whole region, read back in one op: the written ranges hold the source's
  // bytes, the rest the peer's own.
  std::vector<std::byte> back(bytes);
  ASSERT_TRUE(engine->register_memory(back.data(), bytes).ok());
  TransferOp whole{OpKind::kRead, reinterpret_cast<uint64_t>(back.data()), peer.addr, bytes};
  ASSERT_TRUE(engine->transfer_sync(handle, {&whole, 1}).ok());
  std::vector<std::byte> expected(bytes);
  fill_pattern(expected, 62);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto at = static_cast<ptrdiff_t>(i * kStride);
    std::copy_n(src.begin() + at, sizes[i], expected.begin() + at);
  }
  ASSERT_EQ(checksum(back), checksum(expected));
  // READs of the same sizes (each reply eager or by rendezvous as its size says) into a
  // zeroed buffer: each lands whole, and nothing around it is touched.
  std::vector<std::byte> dst(bytes, std::byte{0});
  ASSERT_TRUE(engine->register_memory(dst.data(), bytes).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    ops[i] = {OpKind::kRead, reinterpret_cast<uint64_t>(dst.data()) + i * kStride,
              peer.addr + i * kStride, sizes[i]};
  }
  ASSERT_TRUE(engine->transfer_sync(handle, ops).ok());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto at = static_cast<ptrdiff_t>(i * kStride);
    EXPECT_TRUE(std::equal(dst.begin() + at, dst.begin() + at + static_cast<ptrdiff_t>(sizes[i]),
                           expected.begin() + at))
        << "op of " << sizes[i] << " bytes";
    EXPECT_TRUE(std::all_of(dst.begin() + at + static_cast<ptrdiff_t>(sizes[i]),
                            dst.begin() + at + static_cast<ptrdiff_t>(kStride),
                            [](std::byte b) { return b == std::byte{0}; }))
        << "bytes past the op of " << sizes[i] << " bytes";
  }
}

TEST_F(UcxTwoProcess, OpsOutsideThePeersRegionsAreRefusedBeforePostingNamingTheAddress) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> src(8192, std::byte{1});
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  ASSERT_EQ(ask(peer, "fill 3 0 1048576"), "ok");
  // Just past the end of the peer's buffer, and straddling its end.
  const uint64_t past = peer.addr + peer.bytes;
  TransferOp outside{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), past, 4096};
  TransferOp straddling{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), past - 2048, 4096};
  for (const TransferOp& op : {outside, straddling}) {
    auto batch = engine->submit(handle, {&op, 1});
    ASSERT_FALSE(batch.ok());
    EXPECT_EQ(batch.status().code(), StatusCode::kNotRegistered) << batch.status().to_string();
    EXPECT_TRUE(testing::contains(batch.status().message(), fmt::format("{:#x}", op.remote_addr)))
        << batch.status().message();
  }
  // Nothing was posted: the peer's buffer is untouched.
  EXPECT_EQ(ask(peer, "verify 3 0 1048576"), "ok");
}

TEST_F(UcxTwoProcess, KilledPeerFailsTheBatchWithPeerDisconnectedWithinFiveSeconds) {
  constexpr uint64_t kBytes = 64ull << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> src(kBytes, std::byte{3});
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, kBytes};
  SubmitOptions options;
  options.timeout = std::chrono::seconds(30);
  // 32 batches of one op (a batch may not write one destination twice), 2 GiB in all:
  // seconds of work.
  std::vector<BatchHandle> batches;
  for (int i = 0; i < 32; ++i) batches.push_back(must(engine->submit(handle, {&op, 1}, options)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto t0 = Clock::now();
  peer.process.kill_now();
  for (const BatchHandle& batch : batches) {
    BatchStatus s = engine->wait(batch, std::chrono::seconds(30));
    if (&batch != &batches.back() && s.state == BatchState::kCompleted) continue;  // before kill
    ASSERT_EQ(s.state, BatchState::kFailed);
    EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
  }
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(engine->submit(handle, {&op, 1}).status().code(), StatusCode::kPeerDisconnected);
}

// The ops of one stopped-peer batch over [0, kStoppedBytes) of the peer's buffer: one
// 8 MiB op (a rendezvous chunk) and 1024 ops of 4 KiB every 8 KiB after it (eager: their
// bytes or requests sit in the stopped peer's socket buffer). The gaps keep the engine from
// merging them.
constexpr uint64_t kStoppedBytes = 16ull << 20;
constexpr uint64_t kStoppedBigOp = 8ull << 20;
constexpr uint64_t kStoppedSmallOp = 4096;
constexpr uint64_t kStoppedStride = 8192;

std::vector<TransferOp> stopped_peer_ops(OpKind kind, const std::vector<std::byte>& local,
                                         uint64_t remote) {
  const auto base = reinterpret_cast<uint64_t>(local.data());
  std::vector<TransferOp> ops{{kind, base, remote, kStoppedBigOp}};
  for (uint64_t at = kStoppedBigOp; at < kStoppedBytes; at += kStoppedStride) {
    ops.push_back({kind, base + at, remote + at, kStoppedSmallOp});
  }
  return ops;
}

// Stops the peer and waits until it is stopped.
void stop_peer(ServePeer& peer) {
  ASSERT_EQ(::kill(peer.process.pid(), SIGSTOP), 0);
  int wstatus = 0;
  ASSERT_EQ(::waitpid(peer.process.pid(), &wstatus, WUNTRACED), peer.process.pid());
  ASSERT_TRUE(WIFSTOPPED(wstatus));
}

// Resumes the peer and waits until it has served what queued up while it was stopped: it
// answers a command (so it runs again), then a small READ over ucx into `probe` (answered
// after every request sent before it), then until nothing is in flight between the two
// processes (UCX's tcp connections carry it all).
void resume_peer(TransferEngine& engine, PeerHandle& handle, ServePeer& peer,
                 std::vector<std::byte>& probe) {
  ASSERT_EQ(::kill(peer.process.pid(), SIGCONT), 0);
  ASSERT_EQ(must(peer.process.ask("verify 0 0 0", std::chrono::seconds(10))), "ok");
  TransferOp read{OpKind::kRead, reinterpret_cast<uint64_t>(probe.data()), peer.addr, probe.size()};
  ASSERT_TRUE(engine.transfer_sync(handle, {&read, 1}).ok());
  ASSERT_TRUE(testing::tcp_settles({peer.process.pid(), ::getpid()}))
      << "bytes stayed queued between the two processes";
}

// A stopped peer: its worker serves nothing, so the batch waits until kvferry's deadline;
// after the peer resumes, none of the timed-out READ's replies land (this engine's reply
// handler drops replies to batches that ended), and the next batches succeed.
TEST_F(UcxTwoProcess, StoppedPeerFailsAReadWithTimeoutAndNoByteOfItLandsAfterItResumes) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kStoppedBytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> dst(kStoppedBytes, std::byte{0});
  std::vector<std::byte> probe(4096);
  ASSERT_TRUE(engine->register_memory(dst.data(), kStoppedBytes).ok());
  ASSERT_TRUE(engine->register_memory(probe.data(), probe.size()).ok());
  ASSERT_EQ(ask(peer, fmt::format("fill 61 0 {}", kStoppedBytes)), "ok");
  // One small read first: the endpoint is connected before the peer stops.
  TransferOp warm{OpKind::kRead, reinterpret_cast<uint64_t>(probe.data()), peer.addr, 4096};
  ASSERT_TRUE(engine->transfer_sync(handle, {&warm, 1}).ok());
  stop_peer(peer);
  std::vector<TransferOp> ops = stopped_peer_ops(OpKind::kRead, dst, peer.addr);
  SubmitOptions options;
  options.timeout = std::chrono::milliseconds(500);
  auto t0 = Clock::now();
  BatchHandle batch = must(engine->submit(handle, ops, options));
  BatchStatus s = engine->wait(batch, std::chrono::seconds(10));
  auto took = Clock::now() - t0;
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  EXPECT_GE(took, std::chrono::milliseconds(450));
  EXPECT_LT(took, std::chrono::seconds(3));
  resume_peer(*engine, handle, peer, probe);
  // Not one byte of the timed-out READ landed.
  auto landed = std::find_if(dst.begin(), dst.end(), [](std::byte b) { return b != std::byte{0}; });
  EXPECT_EQ(landed, dst.end()) << "a late byte landed at offset " << (landed - dst.begin());
  // Later batches succeed, both ways.
  ASSERT_TRUE(engine->transfer_sync(handle, ops).ok());
  std::vector<std::byte> expected(kStoppedBytes);
  fill_pattern(expected, 61);
  for (const TransferOp& op : ops) {
    const auto at = static_cast<ptrdiff_t>(op.local_addr - reinterpret_cast<uint64_t>(dst.data()));
    ASSERT_TRUE(std::equal(dst.begin() + at, dst.begin() + at + static_cast<ptrdiff_t>(op.length),
                           expected.begin() + at))
        << "op at offset " << at;
  }
  fill_pattern(dst, 62);
  TransferOp write{OpKind::kWrite, reinterpret_cast<uint64_t>(dst.data()), peer.addr,
                   kStoppedBytes};
  ASSERT_TRUE(engine->transfer_sync(handle, {&write, 1}).ok());
  EXPECT_EQ(ask(peer, fmt::format("verify 62 0 {}", kStoppedBytes)), "ok");
}

// A stopped peer and a WRITE: the chunks (eager bytes in the peer's socket buffer, a
// rendezvous request) reach the peer's handler only after it resumes, past their deadline
// on its clock, so it drops them: the peer still holds its old bytes everywhere.
TEST_F(UcxTwoProcess, StoppedPeerFailsAWriteWithTimeoutAndNoByteOfItLandsAfterItResumes) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kStoppedBytes));
  auto engine = initiator();
  PeerHandle handle = open_ucx(*engine, peer.endpoint);
  std::vector<std::byte> src(kStoppedBytes);
  std::vector<std::byte> probe(4096);
  fill_pattern(src, 71);
  ASSERT_TRUE(engine->register_memory(src.data(), kStoppedBytes).ok());
  ASSERT_TRUE(engine->register_memory(probe.data(), probe.size()).ok());
  ASSERT_EQ(ask(peer, fmt::format("fill 70 0 {}", kStoppedBytes)), "ok");
  TransferOp warm{OpKind::kRead, reinterpret_cast<uint64_t>(probe.data()), peer.addr, 4096};
  ASSERT_TRUE(engine->transfer_sync(handle, {&warm, 1}).ok());
  stop_peer(peer);
  std::vector<TransferOp> ops = stopped_peer_ops(OpKind::kWrite, src, peer.addr);
  SubmitOptions options;
  options.timeout = std::chrono::milliseconds(500);
  auto t0 = Clock::now();
  BatchHandle batch = must(engine->submit(handle, ops, options));
  BatchStatus s = engine->wait(batch, std::chrono::seconds(10));
  auto took = Clock::now() - t0;
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  EXPECT_GE(took, std::chrono::milliseconds(450));
  EXPECT_LT(took, std::chrono::seconds(3));
  resume_peer(*engine, handle, peer, probe);
  // The peer still holds the old pattern everywhere.
  EXPECT_EQ(ask(peer, fmt::format("verify 70 0 {}", kStoppedBytes)), "ok");
  // A later batch succeeds, verified.
  fill_pattern(src, 72);
  TransferOp write{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr,
                   kStoppedBytes};
  ASSERT_TRUE(engine->transfer_sync(handle, {&write, 1}).ok());
  EXPECT_EQ(ask(peer, fmt::format("verify 72 0 {}", kStoppedBytes)), "ok");
}

TEST_F(UcxTwoProcess, RestartedPeerIsReachedAtItsNewIncarnation) {
  ServePeer first = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20));
  auto engine = initiator();
  PeerHandle old_handle = open_ucx(*engine, first.endpoint);
  std::vector<std::byte> src(4096);
  fill_pattern(src, 31);
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), first.addr, 4096};
  ASSERT_TRUE(engine->transfer_sync(old_handle, {&op, 1}).ok());
  const std::string endpoint = first.endpoint;
  first.process.kill_now();
  ServePeer second = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20, {"--listen", endpoint}));
  PeerOptions o;
  o.transport = TransportKind::kUcx;
  for (int i = 0; i < 200 && !engine->open_peer(endpoint, o).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  PeerHandle fresh = open_ucx(*engine, endpoint);
  EXPECT_NE(fresh.incarnation(), old_handle.incarnation());
  op.remote_addr = second.addr;
  ASSERT_TRUE(engine->transfer_sync(fresh, {&op, 1}).ok());
  EXPECT_EQ(ask(second, "verify 31 0 4096"), "ok");
  EXPECT_EQ(engine->submit(old_handle, {&op, 1}).status().code(), StatusCode::kPeerDisconnected);
}

}  // namespace
}  // namespace kvferry
#endif  // KVFERRY_WITH_UCX
