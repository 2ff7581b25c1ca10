// The cma transport between two real processes: this test process (initiator) and a
// `kvferry serve --memory host` child (target) whose buffer is plain anonymous memory it
// registered itself — what shm cannot reach. The child verifies what arrived on its own, from
// the pattern seed, so the check does not trust the initiator's view of the target memory.
#include <fmt/format.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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
using testing::contains;
using testing::make_engine;
using testing::must;

const std::vector<std::string> kHostMemory = {"--memory", "host"};

Route host_route(const PeerHandle& handle) {
  for (const Route& r : handle.routes()) {
    if (r.local == MemoryKind::kHost && r.remote == MemoryKind::kHost) return r;
  }
  return Route{};
}

TEST(CmaTwoProcess, HostMemoryOfASameHostPeerGoesOverCma) {
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20, kHostMemory));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  EXPECT_EQ(handle.transport(), TransportKind::kCma);
  const Route r = host_route(handle);
  ASSERT_TRUE(r.transport.has_value()) << r.reason;
  EXPECT_EQ(*r.transport, TransportKind::kCma) << r.reason;
}

TEST(CmaTwoProcess, TenThousandScatteredWritesAndReadsArriveIntact) {
  ServePeer peer =
      must(start_serve_peer(KVFERRY_CLI_PATH, testing::kScatteredOpsTargetBytes, kHostMemory));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCma);
  testing::expect_ten_thousand_scattered_ops_intact(*engine, handle, peer);
}

TEST(CmaTwoProcess, OneGibibyteWriteAndReadArriveIntact) {
  constexpr uint64_t kBytes = 1ull << 30;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes, kHostMemory));
  auto engine = make_engine("initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCma);
  testing::expect_whole_buffer_write_and_read_intact(*engine, handle, peer, kBytes);
}

TEST(CmaTwoProcess, KilledPeerEndsEveryBatchAndLaterSubmitsFailWithPeerDisconnected) {
  constexpr uint64_t kBytes = 256ull << 20;
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, kBytes, kHostMemory));
  auto engine = make_engine("initiator", 1);
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCma);
  std::vector<std::byte> src(kBytes, std::byte{7});
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  const TransferOp op = testing::expect_killed_peer_ends_queued_writes(*engine, handle, peer, src);
  // A later batch fails with PeerDisconnected: at submit once the pidfd monitor marked the
  // peer, or, if the copier saw the exit (ESRCH) first, in the batch itself.
  auto later = engine->submit(handle, {&op, 1});
  if (later.ok()) {
    const BatchStatus s = engine->wait(*later, std::chrono::seconds(20));
    EXPECT_EQ(s.state, BatchState::kFailed);
    EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
  } else {
    EXPECT_EQ(later.status().code(), StatusCode::kPeerDisconnected) << later.status().to_string();
  }
}

// What the unprivileged initiator (a forked child) saw, sent back over a pipe.
struct RefusedOutcome {
  std::string transport;
  std::string reason;
  std::string write_status;
};

// Runs in the forked child: drops to uid/gid 65534, opens the root-owned peer, reports the
// host-memory route and the outcome of one 64 KiB WRITE.
[[noreturn]] void run_unprivileged_initiator(int out_fd, const ServePeer& peer) {
  auto report = [&](const std::string& text) { testing::write_line(out_fd, text); };
  if (!testing::drop_to_nobody()) {
    report("error: cannot drop privileges");
    ::_exit(1);
  }
  EngineOptions options;
  options.name = "unprivileged";
  auto engine = TransferEngine::create(options);
  if (!engine.ok()) {
    report("error: " + engine.status().to_string());
    ::_exit(1);
  }
  auto handle = (*engine)->open_peer(peer.endpoint);
  if (!handle.ok()) {
    report("error: " + handle.status().to_string());
    ::_exit(1);
  }
  const Route r = host_route(*handle);
  report(r.transport ? std::string(transport_kind_name(*r.transport)) : "none");
  report(r.reason);
  std::vector<std::byte> src(64 << 10);
  fill_pattern(src, 41);
  Status s = (*engine)->register_memory(src.data(), src.size());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, src.size()};
  if (s.ok()) s = (*engine)->transfer_sync(*handle, {&op, 1});
  report(s.ok() ? "ok" : s.to_string());
  ::_exit(0);
}

// Reads the child's three lines, waiting at most `limit` in all.
RefusedOutcome read_outcome(int fd, std::chrono::seconds limit) {
  std::vector<std::string> lines = testing::read_lines(fd, 3, limit);
  return {lines[0], lines[1], lines[2]};
}

TEST(CmaTwoProcess, APeerOfAnotherUserFallsBackToTcpAndTheRouteSaysWhy) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run an initiator as another uid";
  // The peer runs as root; the initiator as uid 65534: the peer's engine refuses it a cma
  // session (the kernel's ptrace check would refuse its copies too).
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20, kHostMemory));
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    run_unprivileged_initiator(fds[1], peer);
  }
  ::close(fds[1]);
  const RefusedOutcome out = read_outcome(fds[0], std::chrono::seconds(60));
  ::close(fds[0]);
  ::kill(child, SIGKILL);  // a no-op when it already exited
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  EXPECT_EQ(out.transport, "tcp") << out.transport << " / " << out.reason;
  EXPECT_TRUE(contains(out.reason, "passed over cma: ")) << out.reason;
  EXPECT_TRUE(contains(out.reason, "uid 65534")) << out.reason;
  EXPECT_TRUE(contains(out.reason, "may not attach to the memory of uid 0")) << out.reason;
  EXPECT_EQ(out.write_status, "ok");
  EXPECT_EQ(ask(peer, fmt::format("verify 41 0 {}", 64 << 10)), "ok");
}

}  // namespace
}  // namespace kvferry
