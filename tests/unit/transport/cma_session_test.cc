// CmaSessionHub: who a cma peer is comes from the kernel (SO_PEERCRED on the target's socket)
// and the target's own declaration, never from the descriptor; unregistering is a fence that
// waits for the copies in flight and cuts off a peer that does not acknowledge. Two hubs in
// this process play target and initiator (the kernel names this pid for both), and raw
// sockets play the attackers.
#include "transport/cma/cma_session.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/net.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

// A hub's io_timeout: long where an answer is expected (a loaded machine must not turn a slow
// answer into a cut-off), short where the test waits for a peer to be cut off.
constexpr auto kPatient = std::chrono::seconds(20);
constexpr auto kImpatient = std::chrono::milliseconds(300);
constexpr auto kStateTimeout = std::chrono::seconds(10);

std::unique_ptr<CmaSessionHub> hub(uint64_t incarnation,
                                   std::optional<std::string> secret = std::nullopt,
                                   std::chrono::milliseconds io_timeout = kPatient) {
  CmaSessionHub::Options options;
  options.incarnation = incarnation;
  options.secret = std::move(secret);
  options.io_timeout = io_timeout;
  return must(CmaSessionHub::start(options));
}

// Waits for a state, never for a guessed time: true once `done` holds.
template <typename Done>
bool eventually(Done done) {
  const auto deadline = Clock::now() + kStateTimeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

// True once the other side closed `fd` (whatever it sent first is read and dropped).
bool closed_by_other_side(int fd) {
  const auto deadline = Clock::now() + kStateTimeout;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    std::byte sink[4096];
    if (::poll(&p, 1, 100) == 1 && ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) <= 0) return true;
  }
  return false;
}

TEST(CmaSession, AnInitiatorSeesTheTargetsDeclaredRangesAndEveryLaterChange) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222);
  target->declare({0x10000, 0x1000});
  auto peer = must(initiator->open(target->name(), "target", ::getpid(), 0x1111));
  EXPECT_EQ(peer->pid(), ::getpid());
  EXPECT_TRUE(peer->declares(0x10000, 0x1000));
  EXPECT_FALSE(peer->declares(0x10000, 0x1001));
  EXPECT_FALSE(peer->declares(0x20000, 1));
  // A registration after the session opened arrives as an Add.
  target->declare({0x11000, 0x1000});
  ASSERT_TRUE(eventually([&] { return peer->declares(0x11000, 0x1000); }));
  EXPECT_TRUE(peer->declares(0x10800, 0x1000)) << "adjacent ranges cover what crosses them";
  // The fence: when revoke returns, the initiator has dropped the range already.
  EXPECT_EQ(target->revoke(std::vector<CmaRange>{{0x10000, 0x1000}}), 0u);
  EXPECT_FALSE(peer->declares(0x10000, 1));
  EXPECT_TRUE(peer->declares(0x11000, 0x1000));
  EXPECT_EQ(target->sessions(), 1u);
}

TEST(CmaSession, ADescriptorThatNamesAnotherPidIsUnauthenticated) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222);
  const pid_t victim = ::getppid();  // any other process: the one a forged descriptor names
  auto refused = initiator->open(target->name(), "forged", victim, 0x1111);
  ASSERT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().to_string();
  EXPECT_TRUE(contains(refused.status().message(), "pid " + std::to_string(victim)));
  EXPECT_TRUE(contains(refused.status().message(), "is pid " + std::to_string(::getpid())));
}

TEST(CmaSession, ADescriptorThatNamesAnotherIncarnationIsUnauthenticated) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222);
  auto refused = initiator->open(target->name(), "forged", ::getpid(), 0x9999);
  ASSERT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().to_string();
  EXPECT_TRUE(contains(refused.status().message(), "incarnation"));
}

TEST(CmaSession, AnInitiatorWithASecretRefusesATargetThatAsksForNone) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222, "cma-secret");
  auto refused = initiator->open(target->name(), "unchallenging", ::getpid(), 0x1111);
  ASSERT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().to_string();
  EXPECT_TRUE(contains(refused.status().message(), "no challenge"));
}

TEST(CmaSession, ATargetWithASecretAdmitsOnlyItsProof) {
  auto target = hub(0x1111, "cma-secret");
  target->declare({0x10000, 0x1000});
  auto without = hub(0x2222);
  auto wrong = hub(0x3333, "another-secret");
  EXPECT_EQ(without->open(target->name(), "t", ::getpid(), 0x1111).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong->open(target->name(), "t", ::getpid(), 0x1111).status().code(),
            StatusCode::kUnauthenticated);
  auto right = hub(0x4444, "cma-secret");
  auto peer = must(right->open(target->name(), "t", ::getpid(), 0x1111));
  EXPECT_TRUE(peer->declares(0x10000, 0x1000));
}

TEST(CmaSession, NothingListeningIsPeerUnreachable) {
  auto initiator = hub(0x2222);
  auto refused = initiator->open("kvferry-cma/no-such-engine", "gone", ::getpid(), 1);
  EXPECT_EQ(refused.status().code(), StatusCode::kPeerUnreachable) << refused.status().to_string();
}

TEST(CmaSession, ACopyOutsideTheDeclaredRangesNeverRunsAndAClosedSessionFailsEveryCopy) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222);
  target->declare({0x10000, 0x1000});
  auto liveness = std::make_shared<PeerLiveness>("target");
  auto peer = must(initiator->open(target->name(), "target", ::getpid(), 0x1111, liveness));
  bool ran = false;
  const iovec outside{reinterpret_cast<void*>(0x10800), 0x1000};
  Status s = peer->copy_within(std::span(&outside, 1), [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  EXPECT_FALSE(ran);
  const iovec inside{reinterpret_cast<void*>(0x10800), 0x800};
  EXPECT_TRUE(peer->copy_within(std::span(&inside, 1), [] { return Status::Ok(); }).ok());
  EXPECT_FALSE(liveness->is_disconnected());
  target.reset();  // the target's engine goes away: its end of the session closes
  ASSERT_TRUE(eventually([&] { return peer->closed(); }));
  // The engine learns it too, and opens the peer afresh next time instead of keeping a link
  // whose every copy fails.
  EXPECT_TRUE(liveness->is_disconnected());
  EXPECT_TRUE(contains(liveness->disconnect_reason(), "cma session closed"));
  s = peer->copy_within(std::span(&inside, 1), [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
  EXPECT_FALSE(ran);
}

// Unregistering waits for the copy in flight: revoke cannot return while a copy into the
// region runs, and once it has returned no copy into it starts.
TEST(CmaSession, ARevokeWaitsForTheCopyInFlightAndNoCopyStartsAfterIt) {
  auto target = hub(0x1111);
  auto initiator = hub(0x2222);
  target->declare({0x10000, 0x1000});
  auto peer = must(initiator->open(target->name(), "target", ::getpid(), 0x1111));
  const iovec range{reinterpret_cast<void*>(0x10000), 0x1000};
  std::atomic<bool> copying{false};
  std::atomic<bool> copy_done{false};
  std::atomic<bool> revoke_returned{false};
  std::thread copier([&] {
    Status s = peer->copy_within(std::span(&range, 1), [&] {
      copying.store(true);
      // Hold the copy until the Revoke is in the initiator's socket.
      pollfd p{peer->fd(), POLLIN, 0};
      EXPECT_EQ(::poll(&p, 1, 10'000), 1);
      EXPECT_FALSE(revoke_returned.load());
      copy_done.store(true);
      return Status::Ok();
    });
    EXPECT_TRUE(s.ok()) << s.to_string();
  });
  ASSERT_TRUE(eventually([&] { return copying.load(); }));
  EXPECT_EQ(target->revoke(std::vector<CmaRange>{{0x10000, 0x1000}}), 0u);
  revoke_returned.store(true);
  EXPECT_TRUE(copy_done.load()) << "revoke returned while a copy into the range ran";
  copier.join();
  bool ran = false;
  Status s = peer->copy_within(std::span(&range, 1), [&] {
    ran = true;
    return Status::Ok();
  });
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  EXPECT_FALSE(ran);
}

// A client that opens a session and then never reads (stopped, hostile) cannot hold an
// unregistration: it is cut off after io_timeout, and revoke says so.
TEST(CmaSession, AnInitiatorThatNeverAcknowledgesIsCutOff) {
  auto target = hub(0x1111, std::nullopt, kImpatient);
  target->declare({0x10000, 0x1000});
  Fd raw = must(connect_abstract(target->name(), "the target's cma socket"));
  std::byte header[kFrameHeaderBytes];
  ASSERT_TRUE(recv_all(raw.get(), header, Clock::now() + kStateTimeout).ok());  // Challenge
  ASSERT_TRUE(
      send_all(raw.get(), make_cma_frame(CmaSessionFrame::kOpen, {}), Clock::now() + kStateTimeout)
          .ok());
  ASSERT_TRUE(eventually([&] { return target->sessions() == 1; }));
  EXPECT_EQ(target->revoke(std::vector<CmaRange>{{0x10000, 0x1000}}), 1u);
  EXPECT_TRUE(closed_by_other_side(raw.get()));
  ASSERT_TRUE(eventually([&] { return target->sessions() == 0; }));
}

// Before it proves anything a connection may send one Open frame: a flood of bytes, or a
// connection that says nothing, is closed without holding anything.
TEST(CmaSession, AnUnauthenticatedConnectionThatFloodsOrStallsIsClosed) {
  auto target = hub(0x1111, "cma-secret", kImpatient);
  Fd flooding = must(connect_abstract(target->name(), "the target's cma socket"));
  std::vector<std::byte> junk(64 << 10, std::byte{0x5a});
  send_all(flooding.get(), junk, Clock::now() + std::chrono::seconds(1)).ignore();
  Fd silent = must(connect_abstract(target->name(), "the target's cma socket"));
  EXPECT_TRUE(closed_by_other_side(flooding.get()));
  EXPECT_TRUE(closed_by_other_side(silent.get()));
  EXPECT_EQ(target->sessions(), 0u);
}

}  // namespace
}  // namespace kvferry
