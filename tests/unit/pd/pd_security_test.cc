// The PD plane against a hostile client on its control port and on the bootstrap server:
// with a secret nothing is accepted before the proof; without one, a connection that is not a
// room's destination can neither abort nor join (hijack) the room, and an unsigned
// registration cannot change a live rank. Legitimate requests alongside succeed, every page
// verified.
#include <gtest/gtest.h>
#include <httplib.h>

#include <functional>
#include <vector>

#include "core/auth.h"
#include "core/net.h"
#include "pd/bootstrap_json.h"
#include "unit/pd/pd_fixture.h"
#include "unit/pd/raw_control_client.h"

namespace kvferry::pd {
namespace {

using kvferry::testing::contains;
using namespace std::chrono_literals;
using testing::ModelShape;
using testing::TestRank;

constexpr const char* kSecret = "pd-plane-secret";

// Raw clients send no heartbeats: a prefill for tests with them waits for their frames long
// enough not to drop them as silent while a loaded machine runs the test.
PdTimeouts patient_with_raw_clients() {
  PdTimeouts t = testing::fast_timeouts();
  t.heartbeat_timeout = 60s;
  return t;
}

// Prefill and decode of one room; the room moves its pages once the sender sends.
struct OneRoom {
  OneRoom(const std::string& bootstrap, const std::optional<std::string>& secret, uint64_t room_id,
          bool decode_metrics = false)
      : p(testing::make_rank("prefill", m, 1, 0, secret)),
        d(testing::make_rank("decode", m, 1, 0, secret)),
        prefill(testing::make_prefill(p, bootstrap, false, patient_with_raw_clients())),
        decode(testing::make_decode(d, testing::fast_timeouts(), decode_metrics)),
        room(room_id) {
    fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
  }
  // Sends every page and checks both sides succeeded and every page arrived intact.
  void transfer_and_verify(KvSender& sender, KvReceiver& receiver) {
    LastChunkExtras none;
    ASSERT_TRUE(sender.send(src, &none).ok());
    ASSERT_EQ(receiver.wait_final(5s), RequestState::kSuccess) << receiver.failure().to_string();
    EXPECT_EQ(sender.wait_final(5s), RequestState::kSuccess) << sender.failure().to_string();
    EXPECT_EQ(count_corrupt_pages(d.buffers.layout, dst, tokens, room, d.heads), 0u);
  }

  ModelShape m;
  TestRank p, d;
  std::unique_ptr<PrefillServer> prefill;
  std::unique_ptr<DecodeClient> decode;
  uint64_t room;
  std::vector<kv::PageIndex> src = testing::pages_from(2, 6);
  std::vector<kv::PageIndex> dst = testing::pages_from(12, 6);
  uint64_t tokens = 6 * ModelShape{}.page_tokens;
};

TEST(PdSecurity, AbortFromAConnectionThatDidNotRegisterTheRoomLeavesItAlone) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  OneRoom r(bootstrap->address(), std::nullopt, 7);
  KvReceiver receiver = testing::must(r.decode->create_receiver(bootstrap->address(), r.room));
  ASSERT_TRUE(receiver.init(r.dst).ok());
  KvSender sender = testing::must(r.prefill->create_sender(r.room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);

  RawControlClient hostile(r.prefill->control_endpoint());
  auto challenge = hostile.read();
  ASSERT_TRUE(challenge.ok()) << challenge.status().to_string();
  ASSERT_TRUE(std::holds_alternative<AuthChallengeMessage>(*challenge));
  EXPECT_TRUE(std::get<AuthChallengeMessage>(*challenge).nonce.empty());  // no secret here
  ASSERT_TRUE(hostile.send(AbortMessage{r.room, "hostile"}).ok());
  // It is told nothing of its own is in flight for the room, and the room goes on.
  auto ack = hostile.read_skipping_heartbeats();
  ASSERT_TRUE(ack.ok()) << ack.status().to_string();
  ASSERT_TRUE(std::holds_alternative<AbortAck>(*ack));
  EXPECT_EQ(sender.poll(), RequestState::kWaitingForInput);
  r.transfer_and_verify(sender, receiver);
}

TEST(PdSecurity, WithASecretNothingIsAcceptedBeforeTheProof) {
  BootstrapServerOptions bo;
  bo.secret = kSecret;
  auto bootstrap = testing::must(BootstrapServer::start(bo));
  OneRoom r(bootstrap->address(), kSecret, 9);
  KvReceiver receiver = testing::must(r.decode->create_receiver(bootstrap->address(), r.room));
  ASSERT_TRUE(receiver.init(r.dst).ok());
  KvSender sender = testing::must(r.prefill->create_sender(r.room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);

  // A client that skips the proof: its Abort is refused with Unauthenticated and the
  // connection closes.
  {
    RawControlClient hostile(r.prefill->control_endpoint());
    auto challenge = hostile.read();
    ASSERT_TRUE(challenge.ok());
    ASSERT_EQ(std::get<AuthChallengeMessage>(*challenge).nonce.size(), sizeof(AuthNonce));
    ASSERT_TRUE(hostile.send(AbortMessage{r.room, "hostile"}).ok());
    auto reply = hostile.read_skipping_heartbeats();
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    ASSERT_TRUE(std::holds_alternative<RegisterReply>(*reply));
    EXPECT_EQ(std::get<RegisterReply>(*reply).code, StatusCode::kUnauthenticated);
    EXPECT_FALSE(hostile.read_skipping_heartbeats().ok());  // closed
  }
  // Nor can it register a layout (and so send requests) without the proof.
  {
    RawControlClient hostile(r.prefill->control_endpoint());
    ASSERT_TRUE(hostile.read().ok());
    ASSERT_TRUE(hostile.send(RegisterLayout{}).ok());
    auto reply = hostile.read_skipping_heartbeats();
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    ASSERT_TRUE(std::holds_alternative<RegisterReply>(*reply));
    EXPECT_EQ(std::get<RegisterReply>(*reply).code, StatusCode::kUnauthenticated);
  }
  // A client with a wrong proof is refused the same way.
  {
    RawControlClient wrong(r.prefill->control_endpoint());
    auto challenge = wrong.read();
    ASSERT_TRUE(challenge.ok());
    const std::string& nonce = std::get<AuthChallengeMessage>(*challenge).nonce;
    AuthProof proof = auth_proof("not-the-secret",
                                 {reinterpret_cast<const std::byte*>(nonce.data()), nonce.size()});
    ASSERT_TRUE(
        wrong.send(AuthProofMessage{std::string(reinterpret_cast<char*>(proof.data()), 32)}).ok());
    ASSERT_TRUE(wrong.send(AbortMessage{r.room, "hostile"}).ok());
    auto reply = wrong.read_skipping_heartbeats();
    ASSERT_TRUE(reply.ok()) << reply.status().to_string();
    ASSERT_TRUE(std::holds_alternative<RegisterReply>(*reply));
    EXPECT_EQ(std::get<RegisterReply>(*reply).code, StatusCode::kUnauthenticated);
  }
  EXPECT_EQ(sender.poll(), RequestState::kWaitingForInput);
  r.transfer_and_verify(sender, receiver);
}

// The bootstrap server here has no secret, so it is the control channel that refuses.
TEST(PdSecurity, ADecodeWithoutTheSecretIsRefusedUnauthenticated) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  TestRank p = testing::make_rank("prefill", m, 1, 0, kSecret);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("another-secret")}) {
    TestRank d = testing::make_rank("decode", m, 1, 0, secret);
    auto decode = testing::make_decode(d);
    KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 3));
    ASSERT_TRUE(receiver.init(testing::pages_from(0, 2)).ok());
    EXPECT_EQ(receiver.wait_final(5s), RequestState::kFailed);
    EXPECT_EQ(receiver.failure().code(), StatusCode::kUnauthenticated)
        << receiver.failure().to_string();
  }
  EXPECT_EQ(prefill->stats().decode_connections, 0u);
}

// Room hijack: a second registered decode that learnt a room id asks for the room's pages.
// It is refused, alone, whatever it claims; the room goes on for its owner and succeeds.
TEST(PdSecurity, RoomHijackByAnotherRegisteredDecodeIsRefusedAndTheOwnerSucceeds) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  OneRoom r(bootstrap->address(), std::nullopt, 7);
  KvReceiver receiver = testing::must(r.decode->create_receiver(bootstrap->address(), r.room));
  ASSERT_TRUE(receiver.init(r.dst).ok());
  KvSender sender = testing::must(r.prefill->create_sender(r.room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);  // the owner's request filled the room

  // A decode rank of its own (tp 1 of 2, so that it may claim two destinations), registered
  // like any other.
  TestRank intruder = testing::make_rank("intruder", r.m, 2, 1);
  RawControlClient hostile(r.prefill->control_endpoint());
  ASSERT_TRUE(hostile.register_as(intruder).ok());
  struct Attempt {
    uint32_t required_dst_ranks;
    StatusCode code;
    const char* why;
  };
  for (const Attempt& a : {Attempt{1, StatusCode::kAlreadyExists, "not a destination of it"},
                           Attempt{2, StatusCode::kInvalidArgument, "differs from 1"},
                           Attempt{1, StatusCode::kAlreadyExists, "not a destination of it"}}) {
    ASSERT_TRUE(hostile.send(TransferRequest{r.room, a.required_dst_ranks, false, r.dst}).ok());
    auto status = hostile.read_status();
    ASSERT_TRUE(status.ok()) << status.status().to_string();
    EXPECT_EQ(status->room, r.room);
    EXPECT_EQ(status->state, RequestState::kFailed);
    EXPECT_EQ(status->code, a.code) << status->reason;
    EXPECT_TRUE(contains(status->reason, "room 7")) << status->reason;
    EXPECT_TRUE(contains(status->reason, a.why)) << status->reason;
  }
  EXPECT_EQ(sender.poll(), RequestState::kWaitingForInput);
  EXPECT_EQ(receiver.poll(), RequestState::kTransferring);
  r.transfer_and_verify(sender, receiver);
}

// Room hijack while a room fills: with two decode TP ranks per prefill rank, the room waits
// for two destinations. A connection claiming a decode rank the room already has, and a
// destination asking a second time, are refused; the real second rank completes the room,
// and both real ranks get every page.
TEST(PdSecurity, RoomHijackByADuplicateTpRankWhileTheRoomFillsIsRefused) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  TestRank p = testing::make_rank("prefill", m, 1, 0);
  TestRank d0 = testing::make_rank("decode0", m, 2, 0);
  TestRank d1 = testing::make_rank("decode1", m, 2, 1);
  TestRank intruder = testing::make_rank("intruder", m, 2, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address(), false, patient_with_raw_clients());
  auto decode1 = testing::make_decode(d1);
  const uint64_t room = 21, tokens = 5 * m.page_tokens;
  const auto src = testing::pages_from(1, 5);
  const auto dst = testing::pages_from(9, 5);
  fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
  KvSender sender = testing::must(prefill->create_sender(room));

  // Decode rank 0, speaking the protocol by hand so that the test knows when prefill has
  // its request.
  RawControlClient rank0(prefill->control_endpoint());
  ASSERT_TRUE(rank0.register_as(d0).ok());
  const TransferRequest request{room, 2, false, dst};
  ASSERT_TRUE(rank0.send(request).ok());
  ASSERT_TRUE(rank0.barrier().ok());

  RawControlClient hostile(prefill->control_endpoint());
  ASSERT_TRUE(hostile.register_as(intruder).ok());
  ASSERT_TRUE(hostile.send(request).ok());
  auto refused = hostile.read_status();
  ASSERT_TRUE(refused.ok()) << refused.status().to_string();
  EXPECT_EQ(refused->state, RequestState::kFailed);
  EXPECT_EQ(refused->code, StatusCode::kAlreadyExists) << refused->reason;
  EXPECT_TRUE(contains(refused->reason, "room 21: decode tp rank 0 is already its destination"))
      << refused->reason;

  ASSERT_TRUE(rank0.send(request).ok());  // the owner itself, again: refused, room kept
  auto repeated = rank0.read_status();
  ASSERT_TRUE(repeated.ok()) << repeated.status().to_string();
  EXPECT_EQ(repeated->state, RequestState::kFailed);
  EXPECT_EQ(repeated->code, StatusCode::kAlreadyExists) << repeated->reason;
  EXPECT_TRUE(contains(repeated->reason, "already sent its TransferRequest")) << repeated->reason;
  EXPECT_EQ(sender.poll(), RequestState::kBootstrapping);

  KvReceiver receiver1 = testing::must(decode1->create_receiver(bootstrap->address(), room));
  ASSERT_TRUE(receiver1.init(dst).ok());
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  LastChunkExtras none;
  ASSERT_TRUE(sender.send(src, &none).ok());
  EXPECT_EQ(sender.wait_final(5s), RequestState::kSuccess) << sender.failure().to_string();
  ASSERT_EQ(receiver1.wait_final(5s), RequestState::kSuccess) << receiver1.failure().to_string();
  auto done = rank0.read_status();
  ASSERT_TRUE(done.ok()) << done.status().to_string();
  EXPECT_EQ(done->state, RequestState::kSuccess) << done->reason;
  EXPECT_EQ(count_corrupt_pages(d0.buffers.layout, dst, tokens, room, d0.heads), 0u);
  EXPECT_EQ(count_corrupt_pages(d1.buffers.layout, dst, tokens, room, d1.heads), 0u);
}

// A room that fails tells every destination at once, each with the reason: the decode ranks
// that are still waiting fail with the room's code, not later with their own Timeout.
TEST(PdSecurity, ARoomThatFailsTellsEveryDestinationAtOnce) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  TestRank p = testing::make_rank("prefill", m, 1, 0);
  TestRank d0 = testing::make_rank("decode0", m, 2, 0);
  TestRank d1 = testing::make_rank("decode1", m, 2, 1);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode0 = testing::make_decode(d0);
  auto decode1 = testing::make_decode(d1);
  const auto dst = testing::pages_from(4, 3);

  // Both destinations attached; one of them aborts: the other is told.
  {
    const uint64_t room = 31;
    KvReceiver receiver0 = testing::must(decode0->create_receiver(bootstrap->address(), room));
    KvReceiver receiver1 = testing::must(decode1->create_receiver(bootstrap->address(), room));
    ASSERT_TRUE(receiver0.init(dst).ok());
    ASSERT_TRUE(receiver1.init(dst).ok());
    KvSender sender = testing::must(prefill->create_sender(room));
    ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
              RequestState::kWaitingForInput);
    receiver0.abort("the request was cancelled");
    ASSERT_EQ(receiver1.wait_final(30s), RequestState::kFailed);
    EXPECT_EQ(receiver1.failure().code(), StatusCode::kCancelled)
        << receiver1.failure().to_string();
    EXPECT_TRUE(contains(receiver1.failure().message(), "room 31 aborted by decode tp 0/2"))
        << receiver1.failure().to_string();
    EXPECT_EQ(sender.wait_final(5s), RequestState::kFailed);
  }
  // Prefill gives a room up with one destination of two attached: that one is told now, the
  // other when it attaches.
  {
    const uint64_t room = 32;
    KvSender sender = testing::must(prefill->create_sender(room));
    KvReceiver receiver0 = testing::must(decode0->create_receiver(bootstrap->address(), room));
    ASSERT_TRUE(receiver0.init(dst).ok());
    ASSERT_EQ(receiver0.wait_at_least(RequestState::kTransferring, 5s),
              RequestState::kTransferring);
    sender.abort("prefill gave the request up");
    ASSERT_EQ(receiver0.wait_final(30s), RequestState::kFailed);
    EXPECT_EQ(receiver0.failure().code(), StatusCode::kCancelled)
        << receiver0.failure().to_string();
    EXPECT_TRUE(contains(receiver0.failure().message(), "prefill gave the request up"))
        << receiver0.failure().to_string();
    KvReceiver receiver1 = testing::must(decode1->create_receiver(bootstrap->address(), room));
    ASSERT_TRUE(receiver1.init(dst).ok());
    ASSERT_EQ(receiver1.wait_final(30s), RequestState::kFailed);
    EXPECT_EQ(receiver1.failure().code(), StatusCode::kCancelled)
        << receiver1.failure().to_string();
  }
}

// A prefill rank and a raw client on it registered as decode tp rank 0 of 2: the rooms the
// client names wait for a second destination that never comes, and fail once
// `bootstrap_timeout` passes. `adjust` changes the prefill's options (its room limits).
struct PrefillWithRawDecode {
  explicit PrefillWithRawDecode(std::chrono::milliseconds bootstrap_timeout,
                                const std::function<void(PrefillServerOptions&)>& adjust = {})
      : prefill(start(bootstrap_timeout, adjust)), rank0(prefill->control_endpoint()) {}

  std::unique_ptr<PrefillServer> start(std::chrono::milliseconds bootstrap_timeout,
                                       const std::function<void(PrefillServerOptions&)>& adjust) {
    PdTimeouts t = patient_with_raw_clients();
    t.bootstrap_timeout = bootstrap_timeout;
    PrefillServerOptions o = testing::prefill_options(p, bootstrap->address(), t);
    if (adjust) adjust(o);
    return testing::must(PrefillServer::create(std::move(o)));
  }

  std::unique_ptr<BootstrapServer> bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  TestRank p = testing::make_rank("prefill", m, 1, 0);
  TestRank d0 = testing::make_rank("decode0", m, 2, 0);
  std::unique_ptr<PrefillServer> prefill;
  RawControlClient rank0;
};

// A flood of rooms that never fill: a registered decode names rooms at will, each with one
// destination of the two it claims, and prefill opens a room no decode ever asks for. Each
// fails once the bootstrap timeout passes (its one destination told), and one timeout later
// prefill holds none of them: such requests cannot pile rooms up.
TEST(PdSecurity, RoomsThatNeverFillFailAndThenGoSoAFloodOfThemCannotPileUp) {
  PrefillWithRawDecode f(300ms);
  auto& prefill = f.prefill;
  auto& rank0 = f.rank0;
  ASSERT_TRUE(rank0.register_as(f.d0).ok());
  constexpr uint64_t kFirstRoom = 1000, kNamedRooms = 200;
  const auto dst = testing::pages_from(4, 3);
  for (uint64_t room = kFirstRoom; room < kFirstRoom + kNamedRooms; ++room) {
    ASSERT_TRUE(rank0.send(TransferRequest{room, 2, false, dst}).ok());
  }
  KvSender orphan = testing::must(prefill->create_sender(5));
  std::vector<bool> told(kNamedRooms, false);
  for (uint64_t i = 0; i < kNamedRooms; ++i) {
    auto status = rank0.read_status();
    ASSERT_TRUE(status.ok()) << status.status().to_string();
    ASSERT_GE(status->room, kFirstRoom);
    ASSERT_LT(status->room, kFirstRoom + kNamedRooms);
    EXPECT_FALSE(told[status->room - kFirstRoom]) << "room " << status->room << " told twice";
    told[status->room - kFirstRoom] = true;
    EXPECT_EQ(status->state, RequestState::kFailed);
    EXPECT_EQ(status->code, StatusCode::kTimeout) << status->reason;
  }
  EXPECT_EQ(orphan.wait_final(5s), RequestState::kFailed);
  EXPECT_EQ(orphan.failure().code(), StatusCode::kTimeout) << orphan.failure().to_string();
  ASSERT_TRUE(kvferry::testing::eventually([&] { return prefill->stats().open_rooms == 0; }, 10s))
      << prefill->stats().open_rooms << " rooms still held";
  EXPECT_EQ(prefill->stats().requests_failed, kNamedRooms + 1);
}

// Room flood, bounded outright: a registered decode that opens rooms without end (requests
// that never fill) is refused past its share, max_open_rooms_per_decode, and every decode
// together past max_open_rooms; each refusal names its limit and leaves nothing behind.
// Requests that join a room already open, and the serving stack's own rooms, are never
// refused. A page list that cannot fit the decode's pool is refused before it opens a room.
TEST(PdSecurity, ADecodeOpeningRoomsWithoutEndIsRefusedPastItsShareAndOthersStillJoin) {
  PrefillWithRawDecode f(60s, [](PrefillServerOptions& o) {  // the rooms stay open throughout
    o.max_open_rooms_per_decode = 40;
    o.max_open_rooms = 60;
  });
  auto& prefill = f.prefill;
  auto& flooder = f.rank0;
  const ModelShape& m = f.m;
  TestRank d1 = testing::make_rank("decode1", m, 2, 1);
  RawControlClient other(prefill->control_endpoint());
  ASSERT_TRUE(flooder.register_as(f.d0).ok());
  ASSERT_TRUE(other.register_as(d1).ok());
  const auto dst = testing::pages_from(4, 3);
  auto expect_refused = [](RawControlClient& c, uint64_t room, StatusCode code,
                           const std::string& reason) {
    auto status = c.read_status();
    ASSERT_TRUE(status.ok()) << status.status().to_string();
    EXPECT_EQ(status->room, room);
    EXPECT_EQ(status->state, RequestState::kFailed);
    EXPECT_EQ(status->code, code) << status->reason;
    EXPECT_TRUE(contains(status->reason, reason)) << status->reason;
  };

  constexpr uint64_t kFlood = 1000, kOther = 2000;
  for (uint64_t room = kFlood; room < kFlood + 50; ++room) {
    ASSERT_TRUE(flooder.send(TransferRequest{room, 2, false, dst}).ok());
  }
  for (uint64_t room = kFlood + 40; room < kFlood + 50; ++room) {
    expect_refused(flooder, room, StatusCode::kFailedPrecondition, "max_open_rooms_per_decode");
  }
  EXPECT_EQ(prefill->stats().open_rooms, 40u);

  // The other decode joins a room the flood opened (it fills: no answer) and opens its own
  // until all decodes together hold max_open_rooms.
  ASSERT_TRUE(other.send(TransferRequest{kFlood, 2, false, dst}).ok());
  for (uint64_t room = kOther; room < kOther + 30; ++room) {
    ASSERT_TRUE(other.send(TransferRequest{room, 2, false, dst}).ok());
  }
  for (uint64_t room = kOther + 20; room < kOther + 30; ++room) {
    expect_refused(other, room, StatusCode::kFailedPrecondition, "max_open_rooms");
  }
  EXPECT_EQ(prefill->stats().open_rooms, 60u);

  // Page lists the decode's pool cannot hold: refused whatever the limits.
  std::vector<kv::PageIndex> past_the_pool = dst;
  past_the_pool.push_back(m.pages);
  ASSERT_TRUE(other.send(TransferRequest{3000, 2, false, past_the_pool}).ok());
  expect_refused(other, 3000, StatusCode::kInvalidArgument,
                 "destination page " + std::to_string(m.pages) + " lies past the");
  ASSERT_TRUE(
      other.send(TransferRequest{3001, 2, false, testing::pages_from(0, m.pages + 1, 0)}).ok());
  expect_refused(other, 3001, StatusCode::kInvalidArgument,
                 std::to_string(m.pages + 1) + " destination pages");

  // The serving stack's rooms are its own: opened past the limit, and the flooded room the
  // other decode joined goes on to wait for its input.
  KvSender own = testing::must(prefill->create_sender(5));
  KvSender joined = testing::must(prefill->create_sender(kFlood));
  EXPECT_EQ(joined.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  EXPECT_EQ(prefill->stats().open_rooms, 61u);
}

// A decode's share comes back as its rooms go: once the rooms it opened failed and were
// forgotten, the same connection opens as many again.
TEST(PdSecurity, ADecodesRoomShareComesBackOnceItsRoomsAreForgotten) {
  PrefillWithRawDecode f(300ms, [](PrefillServerOptions& o) { o.max_open_rooms_per_decode = 5; });
  auto& prefill = f.prefill;
  auto& rank0 = f.rank0;
  ASSERT_TRUE(rank0.register_as(f.d0).ok());
  const auto dst = testing::pages_from(4, 3);
  // Five rooms that never fill, then one past the share; again once they are gone.
  for (uint64_t first : {uint64_t{100}, uint64_t{200}}) {
    for (uint64_t room = first; room <= first + 5; ++room) {
      ASSERT_TRUE(rank0.send(TransferRequest{room, 2, false, dst}).ok());
    }
    int refused = 0, timed_out = 0;
    for (int i = 0; i < 6; ++i) {
      auto status = rank0.read_status();
      ASSERT_TRUE(status.ok()) << status.status().to_string();
      ASSERT_GE(status->room, first);
      ASSERT_LE(status->room, first + 5);
      if (status->code == StatusCode::kFailedPrecondition) {
        EXPECT_EQ(status->room, first + 5) << status->reason;
        ++refused;
      } else {
        EXPECT_EQ(status->code, StatusCode::kTimeout) << status->reason;
        ++timed_out;
      }
    }
    EXPECT_EQ(refused, 1);
    EXPECT_EQ(timed_out, 5);
    ASSERT_TRUE(kvferry::testing::eventually([&] { return prefill->stats().open_rooms == 0; }, 10s))
        << prefill->stats().open_rooms << " rooms still held";
  }
}

// Registration spoofing: an unsigned PUT /register that keeps a live prefill rank's control
// endpoint but claims a restart (a new incarnation), or repoints its engine or control
// endpoint, is refused with 409 naming the field and the registered value. Decode, which
// keeps polling /health meanwhile, sees no restart: its request in flight succeeds.
TEST(PdSecurity, RegistrationSpoofOfALivePrefillRankIsRefusedAndItsRequestSucceeds) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  OneRoom r(bootstrap->address(), std::nullopt, 11, /*decode_metrics=*/true);
  KvReceiver receiver = testing::must(r.decode->create_receiver(bootstrap->address(), r.room));
  ASSERT_TRUE(receiver.init(r.dst).ok());
  KvSender sender = testing::must(r.prefill->create_sender(r.room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  std::span<const kv::PageIndex> src(r.src);
  ASSERT_TRUE(sender.send(src.subspan(0, 3)).ok());  // in flight from here on

  BootstrapClient client(bootstrap->address());
  const RankRegistration live = testing::must(client.rank(0));
  Endpoint e = testing::must(parse_endpoint(bootstrap->address()));
  httplib::Client http(e.host, e.port);
  struct Spoof {
    const char* field;
    std::string registered;
    RankRegistration claim;
  };
  std::vector<Spoof> spoofs;
  spoofs.push_back({"incarnation", std::to_string(live.incarnation), live});
  spoofs.back().claim.incarnation = live.incarnation + 1;
  spoofs.push_back({"engine_endpoint", live.engine_endpoint, live});
  spoofs.back().claim.engine_endpoint = "127.0.0.1:9";
  spoofs.push_back({"incarnation", std::to_string(live.incarnation), live});  // and both
  spoofs.back().claim.incarnation = live.incarnation + 2;
  spoofs.back().claim.engine_endpoint = "127.0.0.1:9";
  spoofs.push_back({"control_endpoint", live.control_endpoint, live});
  spoofs.back().claim.control_endpoint = "127.0.0.1:9";
  for (const Spoof& spoof : spoofs) {
    auto put = http.Put("/register", to_json(spoof.claim).dump(), "application/json");
    ASSERT_TRUE(put);
    EXPECT_EQ(put->status, 409) << put->body;
    EXPECT_TRUE(contains(put->body, std::string("changes ") + spoof.field)) << put->body;
    EXPECT_TRUE(contains(put->body, "registered " + spoof.registered)) << put->body;
  }
  const RankRegistration after = testing::must(client.rank(0));
  EXPECT_EQ(after.incarnation, live.incarnation);
  EXPECT_EQ(after.engine_endpoint, live.engine_endpoint);
  EXPECT_EQ(after.control_endpoint, live.control_endpoint);

  // Two more /health polls by decode: it would have failed the request had it seen a restart.
  auto polls = [&] {
    return r.decode->metrics().value("kvferry_pd_bootstrap_checks_total", {{"result", "ok"}});
  };
  const double before = polls();
  for (int i = 0; i < 500 && polls() < before + 2; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_GE(polls(), before + 2);
  EXPECT_EQ(receiver.poll(), RequestState::kTransferring) << receiver.failure().to_string();
  LastChunkExtras none;
  ASSERT_TRUE(sender.send(src.subspan(3), &none).ok());
  ASSERT_EQ(receiver.wait_final(5s), RequestState::kSuccess) << receiver.failure().to_string();
  EXPECT_EQ(sender.wait_final(5s), RequestState::kSuccess) << sender.failure().to_string();
  EXPECT_EQ(count_corrupt_pages(r.d.buffers.layout, r.dst, r.tokens, r.room, r.d.heads), 0u);
}

// A real restart on the same control port is still taken: the new process answers on that
// port with the incarnation it registers, which is what the bootstrap server checks.
TEST(PdSecurity, APrefillRestartedOnItsControlPortTakesItsRankOver) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  std::string control;
  uint64_t first_incarnation = 0;
  {
    TestRank first = testing::make_rank("prefill", m, 1, 0);
    auto prefill = testing::make_prefill(first, bootstrap->address());
    control = prefill->control_endpoint();
    first_incarnation = first.engine->incarnation();
  }
  TestRank p = testing::make_rank("prefill", m, 1, 0);
  ASSERT_NE(p.engine->incarnation(), first_incarnation);
  PrefillServerOptions o = testing::prefill_options(p, bootstrap->address());
  o.control_listen = control;
  auto restarted = PrefillServer::create(std::move(o));
  ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
  EXPECT_EQ((*restarted)->control_endpoint(), control);
  BootstrapClient client(bootstrap->address());
  EXPECT_EQ(testing::must(client.rank(0)).incarnation, p.engine->incarnation());

  TestRank d = testing::make_rank("decode", m, 1, 0);
  auto decode = testing::make_decode(d);
  const uint64_t room = 41, tokens = 4 * m.page_tokens;
  const auto src = testing::pages_from(0, 4), dst = testing::pages_from(8, 4);
  fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), room));
  ASSERT_TRUE(receiver.init(dst).ok());
  KvSender sender = testing::must((*restarted)->create_sender(room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  LastChunkExtras none;
  ASSERT_TRUE(sender.send(src, &none).ok());
  ASSERT_EQ(receiver.wait_final(5s), RequestState::kSuccess) << receiver.failure().to_string();
  EXPECT_EQ(count_corrupt_pages(d.buffers.layout, dst, tokens, room, d.heads), 0u);
}

// A registration of tp rank 0 of 1 (the shape of ModelShape `m`) made by hand.
RankRegistration tp0_registration(const std::string& control, uint64_t incarnation,
                                  const ModelShape& m) {
  RankRegistration r;
  r.tp_size = 1;
  r.control_endpoint = control;
  r.engine_endpoint = "127.0.0.1:6000";
  r.incarnation = incarnation;
  r.page_size_tokens = m.page_tokens;
  r.dtype_bytes = 2;
  return r;
}

// Whatever else answers on a registered rank's control port (another incarnation's listener
// on a reused port) proves the registered rank gone: a new registration takes the slot.
TEST(PdSecurity, AnotherIncarnationOnTheRegisteredControlPortLetsANewRankIn) {
  auto bootstrap = testing::must(BootstrapServer::start({}));
  ModelShape m;
  TestRank other = testing::make_rank("other", m, 1, 0);
  auto unregistered = testing::make_prefill(other, "");  // greets with its own incarnation
  BootstrapClient client(bootstrap->address());
  // Registered at that port with an incarnation that is not the one listening there.
  const RankRegistration gone =
      tp0_registration(unregistered->control_endpoint(), other.engine->incarnation() + 1, m);
  ASSERT_TRUE(client.register_rank(gone).ok());
  RankRegistration next = gone;
  next.control_endpoint = "127.0.0.1:5999";
  next.incarnation = gone.incarnation + 1;
  ASSERT_TRUE(client.register_rank(next).ok());
  EXPECT_EQ(testing::must(client.rank(0)).incarnation, next.incarnation);
}

// A prefill restarted while its predecessor is still registered and has not gone (here a
// bare listener on the registered port: it accepts and never greets) is refused at first; it
// retries until the predecessor is stale and then registers. When the predecessor never goes
// (no staleness), it gives up after bootstrap_timeout with the refusal.
TEST(PdSecurity, APrefillWaitsForItsRanksLivePredecessorToGoStaleThenRegisters) {
  ModelShape m;
  Endpoint held;
  Fd predecessor = testing::must(listen_tcp({"127.0.0.1", 0}, &held));
  auto register_predecessor = [&](const std::string& address) {
    ASSERT_TRUE(
        BootstrapClient(address).register_rank(tp0_registration(held.to_string(), 1, m)).ok());
  };
  {
    BootstrapServerOptions o;
    o.rank_stale_after = 400ms;
    auto bootstrap = testing::must(BootstrapServer::start(o));
    register_predecessor(bootstrap->address());
    TestRank p = testing::make_rank("prefill", m, 1, 0);
    PrefillServerOptions po = testing::prefill_options(p, bootstrap->address());
    po.metrics = true;
    auto prefill = PrefillServer::create(std::move(po));
    ASSERT_TRUE(prefill.ok()) << prefill.status().to_string();
    EXPECT_EQ(testing::must(BootstrapClient(bootstrap->address()).rank(0)).incarnation,
              p.engine->incarnation());
    EXPECT_GE(
        (*prefill)->metrics().value("kvferry_pd_bootstrap_checks_total", {{"result", "failed"}}),
        1.0);
  }
  {
    auto bootstrap = testing::must(BootstrapServer::start({}));
    register_predecessor(bootstrap->address());
    TestRank p = testing::make_rank("prefill", m, 1, 0);
    PdTimeouts t = testing::fast_timeouts();
    t.bootstrap_timeout = 300ms;
    auto prefill = PrefillServer::create(testing::prefill_options(p, bootstrap->address(), t));
    ASSERT_FALSE(prefill.ok());
    EXPECT_EQ(prefill.status().code(), StatusCode::kAlreadyExists) << prefill.status().to_string();
    EXPECT_TRUE(contains(prefill.status().message(), "the live rank at " + held.to_string()))
        << prefill.status().to_string();
  }
}

}  // namespace
}  // namespace kvferry::pd
