// Engine notifications (TransferEngine::send_notification, SubmitOptions::notification,
// get_notifications): delivery after a batch's bytes on every same-process transport
// (local, shm, cma, tcp), order per sender, the size bound on both sides, authentication,
// a sender's unclean end, and a dead target; and the listener (NotificationReceiver) on its
// own: the hello's bound, which ends leave an entry, a sender held back at its share, and
// deadlines. Data is random and checked byte for byte.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/notify_receiver.h"
#include "engine/notify_wire.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "notification_raw_client.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using namespace std::chrono_literals;
using testing::contains;
using testing::must;

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

// An engine listening on every interface advertises interface addresses, never the
// wildcard; a peer reaching it at the first of them, or at loopback, moves bytes over tcp and
// notifies it (its tcp and notification listeners are dialled at the host the engine was
// reached at). Only those two: tests running alongside add and remove veth interfaces.
TEST(Notifications, AnEngineOnEveryInterfaceIsReachedAtTheHostItWasReachedAt) {
  std::vector<std::byte> src(64 * 1024), dst(64 * 1024);
  auto a = engine_named("a");
  EngineOptions o;
  o.name = "everywhere";
  o.listen_address = "0.0.0.0:0";
  ASSERT_TRUE(testing::wait_for_any_address_port());
  auto b = must(TransferEngine::create(o));
  ASSERT_FALSE(b->endpoints().empty());
  EXPECT_EQ(b->endpoint(), b->endpoints().front());
  ASSERT_TRUE(b->register_memory(dst.data(), dst.size()).ok());
  ASSERT_TRUE(a->register_memory(src.data(), src.size()).ok());
  for (const std::string& endpoint : b->endpoints()) {
    EXPECT_NE(endpoint.rfind("0.0.0.0:", 0), 0u) << endpoint;
  }
  const std::string port = b->endpoint().substr(b->endpoint().rfind(':'));
  uint64_t seed = 70;
  for (const std::string& endpoint : {b->endpoint(), "127.0.0.1" + port}) {
    PeerHandle peer = must(a->open_peer(endpoint, PeerOptions{TransportKind::kTcp}));
    fill_random(src, ++seed);
    TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), src.size()};
    SubmitOptions so;
    so.notification = endpoint;
    ASSERT_TRUE(a->transfer_sync(peer, {&op, 1}, so).ok()) << endpoint;
    EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.size()), 0) << endpoint;
    std::vector<Notification> got = drain(*b, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].bytes, endpoint);
  }
}

// NotificationCompletion::kQueued: a batch is Completed once its notification is queued, so
// an initiator may close the peer, or shut down, right after. What was queued still arrives.
TEST(Notifications, QueuedNotificationsOutliveClosingThePeerAndTheEngine) {
  std::vector<std::byte> src(64 * 1024), dst(64 * 1024);
  auto b = engine_named("b");
  ASSERT_TRUE(b->register_memory(dst.data(), dst.size()).ok());
  auto a = engine_named("a");
  ASSERT_TRUE(a->register_memory(src.data(), src.size()).ok());
  fill_random(src, 91);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), src.size()};
  SubmitOptions so;
  so.notification_completion = NotificationCompletion::kQueued;
  for (const char* then : {"close the peer", "destroy the engine"}) {
    PeerHandle peer = must(a->open_peer(b->endpoint(), PeerOptions{TransportKind::kTcp}));
    so.notification = then;
    ASSERT_TRUE(a->transfer_sync(peer, {&op, 1}, so).ok()) << then;
    if (std::string_view(then) == "close the peer") {
      a->close_peer(peer);
    } else {
      a.reset();
    }
    std::vector<Notification> got = drain(*b, 1);
    ASSERT_EQ(got.size(), 1u) << then;
    EXPECT_EQ(got[0].bytes, then);
  }
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
  EngineOptions small_inbox;
  small_inbox.max_pending_notification_bytes = 100;  // less than one notification
  Status refused = TransferEngine::create(small_inbox).status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.to_string();
  EXPECT_TRUE(contains(refused.message(), "max_pending_notification_bytes 100"))
      << refused.to_string();
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
  // After a notification, a frame claiming 1 GiB: refused with an error frame, the
  // connection closed.
  {
    Fd fd = must(connect_tcp(notify, deadline));
    NotifyHello hello{d.incarnation, 43, "greedy", "127.0.0.1:1"};
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kHello, encode_hello(hello), deadline).ok());
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kChallenge);
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kWelcome);
    ASSERT_TRUE(
        write_notify_frame(fd.get(), NotifyFrame::kNotify, encode_notify(1, "modest"), deadline)
            .ok());
    ASSERT_EQ(must(read_notify_frame(fd.get(), 0, deadline)).type, NotifyFrame::kAck);
    std::byte header[kFrameHeaderBytes];
    encode_frame_header(
        make_frame_header(kNotifyFormat, static_cast<uint16_t>(NotifyFrame::kNotify), 1u << 30),
        header);
    ASSERT_TRUE(send_all(fd.get(), header, deadline).ok());
    NotifyMessage refusal = must(read_notify_frame(fd.get(), 0, deadline));
    EXPECT_EQ(refusal.type, NotifyFrame::kError);
  }
  got = drain(*target, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].bytes, "modest");
  EXPECT_EQ(got[1].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[1].sender, "greedy");
  EXPECT_TRUE(contains(got[1].bytes, "1073741824 bytes")) << got[1].bytes;
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

TEST(Notifications, AnEngineNameLongerThanAHelloCarriesIsRefusedNamingItsSize) {
  auto target = engine_named("target");
  auto long_named = engine_named(std::string(detail::kMaxNotifySenderNameBytes + 1, 'n'));
  PeerHandle peer = must(long_named->open_peer(target->endpoint()));
  Status s = long_named->send_notification(peer, "hi");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), fmt::format("{} bytes", detail::kMaxNotifySenderNameBytes + 1)))
      << s.to_string();
}

using detail::NotificationReceiver;
using testing::notify_hello;
using testing::RawNotifyClient;
using testing::wait_for_state;

constexpr uint64_t kListenerIncarnation = 0x77;

NotificationReceiver::Options listener_options() {
  NotificationReceiver::Options options;
  options.listen = Endpoint{"127.0.0.1", 0};
  options.incarnation = kListenerIncarnation;
  return options;
}

std::unique_ptr<NotificationReceiver> listener(
    NotificationReceiver::Options options = listener_options()) {
  return must(NotificationReceiver::start(std::move(options)));
}

std::string random_text(size_t bytes, uint64_t seed) {
  std::string text(bytes, '\0');
  fill_random(std::as_writable_bytes(std::span(text)), seed);
  return text;
}

TEST(NotificationListener, AHelloLargerThanTheLargestLegitimateOneIsRefusedUnread) {
  auto receiver = listener();
  // The largest legitimate hello: the longest name and endpoint a sender may have.
  detail::NotifyHello largest{kListenerIncarnation, 1,
                              std::string(detail::kMaxNotifySenderNameBytes, 'n'),
                              std::string(detail::kMaxNotifySenderEndpointBytes, 'e')};
  ASSERT_EQ(detail::encode_hello(largest).size(), detail::kMaxNotifyHelloBytes);
  RawNotifyClient fits = must(RawNotifyClient::connect(receiver->endpoint()));
  EXPECT_TRUE(fits.open(largest).ok());
  // One byte more is refused from its header, before the listener holds any of it.
  RawNotifyClient greedy = must(RawNotifyClient::connect(receiver->endpoint()));
  std::byte header[kFrameHeaderBytes];
  encode_frame_header(
      make_frame_header(detail::kNotifyFormat, static_cast<uint16_t>(detail::NotifyFrame::kHello),
                        detail::kMaxNotifyHelloBytes + 1),
      header);
  ASSERT_TRUE(send_all(greedy.fd(), header, Clock::now() + 5s).ok());
  detail::NotifyMessage refusal = must(greedy.read());
  EXPECT_EQ(refusal.type, detail::NotifyFrame::kError);
  const std::string why(reinterpret_cast<const char*>(refusal.payload.data()),
                        refusal.payload.size());
  EXPECT_TRUE(contains(why, fmt::format("limit {}", detail::kMaxNotifyHelloBytes))) << why;
  // A proof frame longer than an HMAC is refused the same way.
  NotificationReceiver::Options secured_options = listener_options();
  secured_options.secret = "s3cret";
  auto secured = listener(secured_options);
  RawNotifyClient prover = must(RawNotifyClient::connect(secured->endpoint()));
  ASSERT_FALSE(must(prover.hello(notify_hello("prover", 2))).nonce.empty());
  ASSERT_TRUE(prover.send(detail::NotifyFrame::kProof, std::vector<std::byte>(33)).ok());
  EXPECT_EQ(must(prover.read()).type, detail::NotifyFrame::kError);
}

TEST(NotificationListener, AConnectionThatDeliveredNothingLeavesNoEntry) {
  auto receiver = listener();
  for (int i = 0; i < 3; ++i) {
    RawNotifyClient c = must(RawNotifyClient::connect(receiver->endpoint()));
    ASSERT_TRUE(c.open(notify_hello("passer-by", 100 + i)).ok());
  }  // each closed without a goodbye
  ASSERT_TRUE(wait_for_state([&] {
    const auto s = receiver->stats();
    return s.welcomed == 3 && s.connections == 0;
  }));
  EXPECT_TRUE(receiver->drain(SIZE_MAX).empty());
  const auto s = receiver->stats();
  EXPECT_EQ(s.inbox_entries, 0u);
  EXPECT_EQ(s.inbox_bytes, 0u);
  EXPECT_EQ(s.buffered_bytes, 0u);
  EXPECT_EQ(s.dropped, 0u);
}

TEST(NotificationListener, AProvenSenderThatEndsUncleanlyIsReportedEvenWithoutMessages) {
  NotificationReceiver::Options options = listener_options();
  options.secret = "s3cret";
  auto receiver = listener(options);
  {
    RawNotifyClient c = must(RawNotifyClient::connect(receiver->endpoint()));
    ASSERT_TRUE(c.open(notify_hello("proven", 5), std::string("s3cret")).ok());
  }
  std::vector<Notification> got;
  ASSERT_TRUE(wait_for_state([&] {
    for (Notification& n : receiver->drain(SIZE_MAX)) got.push_back(std::move(n));
    return !got.empty();
  }));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[0].sender, "proven");
  EXPECT_EQ(got[0].sender_incarnation, 5u);
  EXPECT_TRUE(contains(got[0].bytes, "without a goodbye")) << got[0].bytes;
  // One that says goodbye leaves nothing, and gives back the room it had reserved.
  {
    RawNotifyClient c = must(RawNotifyClient::connect(receiver->endpoint()));
    ASSERT_TRUE(c.open(notify_hello("polite", 6), std::string("s3cret")).ok());
    ASSERT_TRUE(c.send(detail::NotifyFrame::kBye, {}).ok());
  }
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().connections == 0; }));
  EXPECT_TRUE(receiver->drain(SIZE_MAX).empty());
  EXPECT_EQ(receiver->stats().inbox_entries, 0u);
  EXPECT_EQ(receiver->stats().inbox_bytes, 0u);
}

// With room for 8 entries a sender alone may hold 4: its first notification with the room
// reserved for its loss, and two more. The rest wait unacknowledged, its connection unread,
// while another sender still gets in; each drain lets more of them in, in order.
TEST(NotificationListener, ASenderOverItsShareIsHeldBackUnacknowledgedUntilTheOwnerDrains) {
  NotificationReceiver::Options options = listener_options();
  options.max_pending = 8;
  auto receiver = listener(options);
  constexpr int kCount = 6;
  std::vector<std::string> sent;
  for (int i = 0; i < kCount; ++i) sent.push_back(random_text(100 + i, 500 + i));
  RawNotifyClient busy = must(RawNotifyClient::connect(receiver->endpoint()));
  ASSERT_TRUE(busy.open(notify_hello("busy", 1)).ok());
  for (int i = 0; i < kCount; ++i) ASSERT_TRUE(busy.notify(i + 1, sent[i]).ok());
  for (uint64_t seq = 1; seq <= 3; ++seq) EXPECT_EQ(must(busy.ack()), seq);
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().waiting == 1; }));
  EXPECT_FALSE(busy.readable_now()) << "the fourth notification was acknowledged";
  EXPECT_EQ(receiver->stats().held_back, 1u);
  EXPECT_EQ(receiver->stats().inbox_entries, 4u);
  // Another sender is not held back by the busy one.
  RawNotifyClient other = must(RawNotifyClient::connect(receiver->endpoint()));
  ASSERT_TRUE(other.open(notify_hello("other", 2)).ok());
  const std::string other_bytes = random_text(64, 99);
  ASSERT_TRUE(other.notify(1, other_bytes).ok());
  EXPECT_EQ(must(other.ack()), 1u);
  // The owner drains; the busy sender's notifications follow in order, each acknowledged.
  std::vector<Notification> got;
  uint64_t next_ack = 4;
  ASSERT_TRUE(wait_for_state([&] {
    for (Notification& n : receiver->drain(SIZE_MAX)) got.push_back(std::move(n));
    while (next_ack <= kCount && busy.readable_now()) {
      const uint64_t acked = must(busy.ack());
      EXPECT_EQ(acked, next_ack);
      ++next_ack;
    }
    return got.size() == kCount + 1 && next_ack == kCount + 1;
  })) << got.size()
      << " drained, next ack " << next_ack;
  int busy_seen = 0;
  for (const Notification& n : got) {
    EXPECT_EQ(n.kind, Notification::Kind::kMessage);
    if (n.sender == "other") {
      EXPECT_EQ(n.bytes, other_bytes);
    } else {
      ASSERT_EQ(n.sender, "busy");
      EXPECT_EQ(n.bytes, sent[busy_seen]) << "notification " << busy_seen + 1;
      ++busy_seen;
    }
  }
  EXPECT_EQ(busy_seen, kCount);
  EXPECT_EQ(receiver->stats().waiting, 0u);
  EXPECT_EQ(receiver->stats().dropped, 0u);
}

// A notification read but held back is not acknowledged; if its connection breaks meanwhile
// it is counted dropped, and the sender, which had delivered before, is reported lost.
TEST(NotificationListener, AHeldBackNotificationWhoseConnectionBreaksIsCountedDropped) {
  NotificationReceiver::Options options = listener_options();
  options.max_pending = 4;  // alone, a sender holds 2: its first notification and its reservation
  auto receiver = listener(options);
  RawNotifyClient c = must(RawNotifyClient::connect(receiver->endpoint()));
  ASSERT_TRUE(c.open(notify_hello("breaker", 3)).ok());
  const std::string first = random_text(200, 31);
  ASSERT_TRUE(c.notify(1, first).ok());
  ASSERT_EQ(must(c.ack()), 1u);
  ASSERT_TRUE(c.notify(2, random_text(200, 32)).ok());
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().waiting == 1; }));
  const linger reset_on_close{1, 0};
  ASSERT_EQ(::setsockopt(c.fd(), SOL_SOCKET, SO_LINGER, &reset_on_close, sizeof(reset_on_close)),
            0);
  c.close();
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().connections == 0; }));
  EXPECT_EQ(receiver->stats().dropped, 1u);
  std::vector<Notification> got = receiver->drain(SIZE_MAX);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].bytes, first);
  EXPECT_EQ(got[1].kind, Notification::Kind::kSenderLost);
  EXPECT_EQ(got[1].sender, "breaker");
  EXPECT_EQ(receiver->stats().inbox_entries, 0u);
  EXPECT_EQ(receiver->stats().buffered_bytes, 0u);
}

TEST(NotificationListener, FramesThatStopComingAreClosedAndTheirBuffersFreed) {
  NotificationReceiver::Options options = listener_options();
  options.io_timeout = 1000ms;
  auto receiver = listener(options);
  constexpr int kStalled = 10;
  std::vector<RawNotifyClient> stalled;
  for (int i = 0; i < kStalled; ++i) {
    RawNotifyClient c = must(RawNotifyClient::connect(receiver->endpoint()));
    ASSERT_TRUE(c.open(notify_hello("staller" + std::to_string(i), 1)).ok());
    // Half a notification: its header and 2000 of its 4104 bytes.
    std::vector<std::byte> frame =
        make_frame(detail::kNotifyFormat, static_cast<uint16_t>(detail::NotifyFrame::kNotify),
                   detail::encode_notify(1, random_text(4096, i)));
    frame.resize(kFrameHeaderBytes + 2000);
    ASSERT_TRUE(send_all(c.fd(), frame, Clock::now() + 5s).ok());
    stalled.push_back(std::move(c));
  }
  // And a hello that stops half way.
  RawNotifyClient half_hello = must(RawNotifyClient::connect(receiver->endpoint()));
  ASSERT_TRUE(
      send_all(half_hello.fd(), std::vector<std::byte>(6, std::byte{0x4B}), Clock::now() + 5s)
          .ok());
  ASSERT_TRUE(wait_for_state([&] {
    return receiver->stats().buffered_bytes >= kStalled * (kFrameHeaderBytes + 2000);
  })) << receiver->stats().buffered_bytes;
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().connections == 0; }, 5s));
  EXPECT_EQ(receiver->stats().buffered_bytes, 0u);
  for (RawNotifyClient& c : stalled) {
    std::byte probe[16];
    EXPECT_EQ(::recv(c.fd(), probe, sizeof(probe), MSG_DONTWAIT), 0) << "closed by the listener";
  }
  // They had delivered nothing: no entry.
  EXPECT_TRUE(receiver->drain(SIZE_MAX).empty());
}

}  // namespace
}  // namespace kvferry
