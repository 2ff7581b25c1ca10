// Engine notifications (TransferEngine::send_notification, SubmitOptions::notification,
// get_notifications): delivery after a batch's bytes on every same-process transport
// (local, shm, cma, tcp), order per sender, the size bound on both sides, authentication,
// a sender's unclean end, and a dead target. Data is random and checked byte for byte.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/notify_wire.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::contains;
using testing::must;

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Tests declare their buffers before their engines, so the engines' threads end before the
// memory they registered is freed (ThreadSanitizer does not see the order a socket gives).
std::unique_ptr<TransferEngine> engine_named(const std::string& name,
                                             std::optional<std::string> secret = std::nullopt,
                                             size_t max_bytes = kDefaultMaxNotificationBytes,
                                             bool ucx_allow_emulated = false) {
  EngineOptions o;
  // UCX on loopback only (and shared memory): integration tests running alongside create
  // and remove veth interfaces, which a UCX worker would advertise.
  if (ucx_allow_emulated) ::setenv("UCX_NET_DEVICES", "lo", 0);
  o.ucx_allow_emulated = ucx_allow_emulated;  // UCX here has no RDMA: its tcp/shm paths
  o.name = name;
  o.secret = std::move(secret);
  o.max_notification_bytes = max_bytes;
  o.batch_timeout = 10'000ms;
  return must(TransferEngine::create(o));
}

void fill_random(std::span<std::byte> bytes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (auto& b : bytes) b = static_cast<std::byte>(rng());
}

// Drains `engine` until `count` entries arrived or 10 s passed.
std::vector<Notification> drain(TransferEngine& engine, size_t count) {
  std::vector<Notification> got;
  for (int i = 0; i < 2000 && got.size() < count; ++i) {
    for (Notification& n : engine.get_notifications()) got.push_back(std::move(n));
    if (got.size() < count) std::this_thread::sleep_for(5ms);
  }
  return got;
}

struct Case {
  TransportKind transport;
  OpKind op;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return fmt::format("{}_{}", transport_kind_name(info.param.transport),
                     info.param.op == OpKind::kWrite ? "Write" : "Read");
}

class NotificationAfterData : public ::testing::TestWithParam<Case> {};

// The initiator moves random bytes with a notification; when the target drains it, every
// byte is in the destination (the target's memory for WRITE, the initiator's for READ).
TEST_P(NotificationAfterData, ArrivesOnlyOnceEveryByteIsInPlace) {
  const Case c = GetParam();
  const bool ucx = c.transport == TransportKind::kUcx;
  auto initiator = engine_named("initiator", std::nullopt, kDefaultMaxNotificationBytes, ucx);
  std::unique_ptr<TransferEngine> target_engine;
  TransferEngine* target = initiator.get();
  if (c.transport != TransportKind::kLocal) {
    target_engine = engine_named("target", std::nullopt, kDefaultMaxNotificationBytes, ucx);
    target = target_engine.get();
  }
  constexpr size_t kBytes = 3u << 20;
  constexpr int kRounds = 3;
  // Each round has bytes of its own: a round never rewrites what the last one sent (the
  // sender's socket reads happen-before the next round only through the kernel, which
  // ThreadSanitizer does not see).
  SharedBuffer local = must(initiator->allocate_shared(kBytes * kRounds));
  SharedBuffer remote = must(target->allocate_shared(kBytes * kRounds));
  PeerOptions po;
  if (c.transport != TransportKind::kLocal) po.transport = c.transport;
  PeerHandle peer = must(initiator->open_peer(target->endpoint(), po));
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t local_base = addr_of(local.addr) + round * kBytes;
    const uint64_t remote_base = addr_of(remote.addr) + round * kBytes;
    std::span<std::byte> src(
        reinterpret_cast<std::byte*>(c.op == OpKind::kWrite ? local_base : remote_base), kBytes);
    std::span<std::byte> dst(
        reinterpret_cast<std::byte*>(c.op == OpKind::kWrite ? remote_base : local_base), kBytes);
    fill_random(src, 100 + round);
    std::memset(dst.data(), 0, kBytes);
    std::vector<TransferOp> ops;
    for (size_t off = 0; off < kBytes; off += 256 * 1024) {  // reversed: nothing merges
      const size_t at = kBytes - 256 * 1024 - off;
      ops.push_back({c.op, local_base + at, remote_base + at, 256 * 1024});
    }
    SubmitOptions so;
    so.notification = fmt::format("round {}", round);
    BatchHandle b = must(initiator->submit(peer, ops, so));
    std::vector<Notification> got = drain(*target, 1);
    ASSERT_EQ(got.size(), 1u);
    // Checked before the initiator waits: the notification alone says the bytes are there.
    ASSERT_EQ(std::memcmp(src.data(), dst.data(), kBytes), 0);
    EXPECT_EQ(got[0].kind, Notification::Kind::kMessage);
    EXPECT_EQ(got[0].bytes, *so.notification);
    EXPECT_EQ(got[0].sender, "initiator");
    EXPECT_EQ(got[0].sender_endpoint, initiator->endpoint());
    BatchStatus s = initiator->wait(b, 10s);
    ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  }
  EXPECT_TRUE(target->get_notifications().empty());
}

// Every transport that can run in one process (ucx when built: over UCX's emulated paths).
std::vector<Case> notification_cases() {
  std::vector<Case> cases;
  for (TransportKind kind :
       {TransportKind::kLocal, TransportKind::kShm, TransportKind::kCma, TransportKind::kTcp}) {
    cases.push_back({kind, OpKind::kWrite});
    cases.push_back({kind, OpKind::kRead});
  }
#ifdef KVFERRY_WITH_UCX
  cases.push_back({TransportKind::kUcx, OpKind::kWrite});
  cases.push_back({TransportKind::kUcx, OpKind::kRead});
#endif
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Transports, NotificationAfterData,
                         ::testing::ValuesIn(notification_cases()), case_name);

TEST(Notifications, StandaloneAndBatchNotificationsKeepTheSendersOrder) {
  std::vector<std::byte> src(4096), dst(4096);
  auto a = engine_named("a");
  auto b = engine_named("b");
  fill_random(src, 9);
  ASSERT_TRUE(a->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(b->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = must(a->open_peer(b->endpoint()));
  constexpr int kCount = 200;
  std::vector<BatchHandle> batches;
  for (int i = 0; i < kCount; ++i) {
    if (i % 2 == 0) {
      ASSERT_TRUE(a->send_notification(peer, fmt::format("n{}", i)).ok());
    } else {
      // Each batch completes before the next notification is sent (transfer_sync waits for
      // its notification's ack), so the order is the program's.
      TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), src.size()};
      SubmitOptions so;
      so.notification = fmt::format("n{}", i);
      ASSERT_TRUE(a->transfer_sync(peer, {&op, 1}, so).ok());
    }
  }
  std::vector<Notification> got = drain(*b, kCount);
  ASSERT_EQ(got.size(), static_cast<size_t>(kCount));
  for (int i = 0; i < kCount; ++i) EXPECT_EQ(got[i].bytes, fmt::format("n{}", i));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0);
}

TEST(Notifications, ConcurrentSendersAreEachInOrder) {
  auto target = engine_named("target");
  auto a = engine_named("a");
  auto c = engine_named("c");
  PeerHandle pa = must(a->open_peer(target->endpoint()));
  PeerHandle pc = must(c->open_peer(target->endpoint()));
  constexpr int kCount = 100;
  std::thread ta([&] {
    for (int i = 0; i < kCount; ++i) a->send_notification(pa, std::to_string(i)).ignore();
  });
  std::thread tc([&] {
    for (int i = 0; i < kCount; ++i) c->send_notification(pc, std::to_string(i)).ignore();
  });
  ta.join();
  tc.join();
  std::vector<Notification> got = drain(*target, 2 * kCount);
  ASSERT_EQ(got.size(), 2u * kCount);
  int next_a = 0, next_c = 0;
  for (const Notification& n : got) {
    int& next = n.sender == "a" ? next_a : next_c;
    EXPECT_EQ(n.bytes, std::to_string(next)) << "from " << n.sender;
    ++next;
  }
  EXPECT_EQ(next_a, kCount);
  EXPECT_EQ(next_c, kCount);
}

TEST(Notifications, LargerThanTheLimitIsRefusedNamingTheSize) {
  std::vector<std::byte> src(64), dst(64);
  auto a = engine_named("a", std::nullopt, 64);
  auto b = engine_named("b", std::nullopt, 16);
  ASSERT_TRUE(a->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(b->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = must(a->open_peer(b->endpoint()));
  // This engine's own limit, before anything moves.
  Status s = a->send_notification(peer, std::string(65, 'x'));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), "65 bytes")) << s.to_string();
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), 64};
  SubmitOptions so;
  so.notification = std::string(65, 'x');
  EXPECT_EQ(a->submit(peer, {&op, 1}, so).status().code(), StatusCode::kInvalidArgument);
  // The peer's smaller limit (announced when connecting).
  s = a->send_notification(peer, std::string(17, 'x'));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), "17 bytes")) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "limit of 16")) << s.to_string();
  EXPECT_TRUE(a->send_notification(peer, std::string(16, 'y')).ok());
  std::vector<Notification> got = drain(*b, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].bytes, std::string(16, 'y'));
  EXPECT_EQ(EngineOptions{}.max_notification_bytes, 4096u);
  EngineOptions bad;
  bad.max_notification_bytes = 0;
  EXPECT_EQ(TransferEngine::create(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST(Notifications, ASecretIsRequiredWhenTheTargetHasOne) {
  using namespace detail;
  auto target = engine_named("target", "s3cret");
  auto stranger = engine_named("stranger");
  auto liar = engine_named("liar", "wrong");
  auto friend_engine = engine_named("friend", "s3cret");
  // The handshake already keeps the descriptor (and so the notification endpoint) from
  // peers without the secret.
  EXPECT_EQ(stranger->open_peer(target->endpoint()).status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(liar->open_peer(target->endpoint()).status().code(), StatusCode::kUnauthenticated);
  // The notification listener checks on its own, for whoever learnt its endpoint: a sender
  // whose proof is wrong is refused and nothing reaches the inbox.
  const Endpoint handshake = must(parse_endpoint(target->endpoint()));
  const auto deadline = Clock::now() + 5s;
  SegmentDescriptor d = must(
      parse_segment_descriptor(must(fetch_descriptor(handshake, deadline, std::string("s3cret")))));
  {
    Fd fd = must(connect_tcp(must(parse_endpoint(d.notify_endpoint)), deadline));
    NotifyHello hello{d.incarnation, 44, "liar", "127.0.0.1:1"};
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline).ok());
    NotifyMessage challenge = must(read_notify_frame(fd.get(), 0, deadline));
    ASSERT_EQ(challenge.type, NotifyFrame::kChallenge);
    ASSERT_FALSE(must(decode_challenge(challenge.payload)).nonce.empty());
    const std::array<std::byte, 32> wrong_proof{};
    ASSERT_TRUE(write_notify_frame(fd.get(), NotifyFrame::kProof, wrong_proof, deadline).ok());
    EXPECT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kError);
  }
  ASSERT_TRUE(
      friend_engine->send_notification(must(friend_engine->open_peer(target->endpoint())), "hi")
          .ok());
  std::vector<Notification> got = drain(*target, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].sender, "friend");
  EXPECT_EQ(got[0].bytes, "hi");
}

TEST(Notifications, ADeadTargetFailsTheSendNeverHangs) {
  auto a = engine_named("a");
  auto b = engine_named("b");
  PeerHandle peer = must(a->open_peer(b->endpoint()));
  ASSERT_TRUE(a->send_notification(peer, "first").ok());  // the connection is up
  b.reset();
  Status s = a->send_notification(peer, "second", 3000ms);
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
  // Closed peers refuse at once, too.
  a->close_peer(peer);
  EXPECT_EQ(a->send_notification(peer, "third").code(), StatusCode::kPeerDisconnected);
}

// A sender whose connection ends without its goodbye (it died) shows as kSenderLost after
// what it had sent; an oversized frame is refused before anything is allocated for it.
TEST(Notifications, ASendersUncleanEndIsReportedAfterItsMessages) {
  using namespace detail;
  auto target = engine_named("target");
  const Endpoint handshake = must(parse_endpoint(target->endpoint()));
  SegmentDescriptor d =
      must(parse_segment_descriptor(must(fetch_descriptor(handshake, Clock::now() + 2s))));
  ASSERT_FALSE(d.notify_endpoint.empty());
  const Endpoint notify = must(parse_endpoint(d.notify_endpoint));
  const auto deadline = Clock::now() + 5s;
  {
    Fd fd = must(connect_tcp(notify, deadline));
    NotifyHello hello{d.incarnation, 42, "ghost", "127.0.0.1:1"};
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline).ok());
    NotifyMessage challenge = must(read_notify_frame(fd.get(), 0, deadline));
    ASSERT_EQ(challenge.type, NotifyFrame::kChallenge);
    EXPECT_EQ(must(decode_challenge(challenge.payload)).max_notification_bytes, 4096u);
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kWelcome);
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kNotify, encode_notify(1, "last words"), deadline)
            .ok());
    NotifyMessage ack = must(read_notify_frame(fd.get(), 0, deadline));
    ASSERT_EQ(ack.type, NotifyFrame::kAck);
    EXPECT_EQ(must(decode_sequence(ack.payload)), 1u);
  }  // closed without kBye
  std::vector<Notification> got = drain(*target, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].kind, Notification::Kind::kMessage);
  EXPECT_EQ(got[0].bytes, "last words");
  EXPECT_EQ(got[1].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[1].sender, "ghost");
  // A frame claiming 1 GiB: refused with an error frame, the connection closed.
  {
    Fd fd = must(connect_tcp(notify, deadline));
    NotifyHello hello{d.incarnation, 43, "greedy", "127.0.0.1:1"};
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline).ok());
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kChallenge);
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kWelcome);
    std::byte header[kFrameHeaderBytes];
    encode_frame_header(
        make_frame_header(kNotifyFormat, static_cast<uint16_t>(NotifyFrame::kNotify), 1u << 30),
        header);
    ASSERT_TRUE(send_all(fd.get(), header, deadline).ok());
    NotifyMessage refusal = must(read_notify_frame(fd.get(), 0, deadline));
    EXPECT_EQ(refusal.type, NotifyFrame::kError);
  }
  got = drain(*target, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[0].sender, "greedy");
  // A hello for another incarnation (the target restarted) is refused.
  {
    Fd fd = must(connect_tcp(notify, deadline));
    NotifyHello hello{d.incarnation + 1, 44, "late", "127.0.0.1:1"};
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline).ok());
    NotifyMessage refusal = must(read_notify_frame(fd.get(), 0, deadline));
    EXPECT_EQ(refusal.type, NotifyFrame::kError);
  }
}

}  // namespace
}  // namespace kvferry
