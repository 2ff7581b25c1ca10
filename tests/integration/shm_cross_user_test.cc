// Same-host shared memory across users: a `kvferry serve` child (root) and an initiator
// running as uid 65534. The serving engine hands its memfd (SCM_RIGHTS) only to a process of
// its own user or one that proves the secret, so the initiator's shm route is out: its bytes
// go by the next route (and the route says why), and a forced shm is refused Unauthenticated.
// With the same secret on both sides, the other user maps the memory and writes over shm.
// The serve child verifies what arrived from the pattern seed.
#include <grp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
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
using testing::must;

constexpr uint64_t kWriteBytes = 64 << 10;
constexpr const char* kCrossUserSecret = "cross-user-secret";

// What the unprivileged initiator saw, one line each.
struct Outcome {
  std::string transport;   // of the host -> shared_host route
  std::string reason;      // that route's reason
  std::string write;       // "ok" or the status of one WRITE of kWriteBytes
  std::string forced_shm;  // open_peer with shm forced: "ok" or the status code's name
};

// In the forked child: drops to uid/gid 65534, opens the root-owned peer, reports.
[[noreturn]] void run_as_other_user(int out_fd, const ServePeer& peer,
                                    std::optional<std::string> secret, uint32_t seed) {
  auto report = [&](const std::string& text) { testing::write_line(out_fd, text); };
  if (!testing::drop_to_nobody()) {
    report("error: cannot drop privileges");
    ::_exit(1);
  }
  EngineOptions options;
  options.name = "other-user";
  options.secret = std::move(secret);
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
  Route route;
  for (const Route& r : handle->routes()) {
    if (r.local == MemoryKind::kHost && r.remote == MemoryKind::kSharedHost) route = r;
  }
  report(route.transport ? std::string(transport_kind_name(*route.transport)) : "none");
  report(route.reason);
  std::vector<std::byte> src(kWriteBytes);
  fill_pattern(src, seed);
  Status s = (*engine)->register_memory(src.data(), src.size());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), peer.addr, src.size()};
  if (s.ok()) s = (*engine)->transfer_sync(*handle, {&op, 1});
  report(s.ok() ? "ok" : s.to_string());
  (*engine)->close_peer(*handle);
  PeerOptions forced;
  forced.transport = TransportKind::kShm;
  auto shm = (*engine)->open_peer(peer.endpoint, forced);
  report(shm.ok() ? "ok" : std::string(status_code_name(shm.status().code())));
  ::_exit(0);
}

Outcome read_outcome(int fd) {
  std::vector<std::string> lines = testing::read_lines(fd, 4, std::chrono::seconds(60));
  return {lines[0], lines[1], lines[2], lines[3]};
}

Outcome run_other_user(const ServePeer& peer, std::optional<std::string> secret, uint32_t seed) {
  int fds[2];
  if (::pipe(fds) != 0) return {"error: pipe", "", "", ""};
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    run_as_other_user(fds[1], peer, std::move(secret), seed);
  }
  ::close(fds[1]);
  Outcome out = read_outcome(fds[0]);
  ::close(fds[0]);
  ::kill(child, SIGKILL);  // a no-op when it already exited
  int wstatus = 0;
  ::waitpid(child, &wstatus, 0);
  return out;
}

class ShmCrossUser : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run an initiator as another uid";
  }
};

TEST_F(ShmCrossUser, AnotherUserWithoutTheSecretTakesTheNextRouteAndForcedShmIsRefused) {
  ::unsetenv("KVFERRY_SECRET");
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20));
  const Outcome out = run_other_user(peer, std::nullopt, 43);
  EXPECT_NE(out.transport, "shm") << out.transport << " / " << out.reason;
  EXPECT_NE(out.transport, "none") << out.reason;
  EXPECT_TRUE(contains(out.reason, "may not map the shared memory")) << out.reason;
  EXPECT_EQ(out.write, "ok");
  EXPECT_EQ(out.forced_shm, "Unauthenticated");
  EXPECT_EQ(ask(peer, "verify 43 0 " + std::to_string(kWriteBytes)), "ok");
}

TEST_F(ShmCrossUser, AnotherUserWithTheSecretMapsTheMemoryOverShm) {
  ::setenv("KVFERRY_SECRET", kCrossUserSecret, 1);  // the serve child inherits it
  ServePeer peer = must(start_serve_peer(KVFERRY_CLI_PATH, 1 << 20));
  ::unsetenv("KVFERRY_SECRET");
  const Outcome out = run_other_user(peer, kCrossUserSecret, 44);
  EXPECT_EQ(out.transport, "shm") << out.transport << " / " << out.reason;
  EXPECT_EQ(out.write, "ok");
  EXPECT_EQ(out.forced_shm, "ok");
  EXPECT_EQ(ask(peer, "verify 44 0 " + std::to_string(kWriteBytes)), "ok");
}

}  // namespace
}  // namespace kvferry
