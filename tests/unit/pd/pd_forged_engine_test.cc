// Attack class: a forged engine behind a PD registration (confused deputy through the PD
// plane). A client on a prefill rank's control port — no secret on the plane, so anyone who
// can connect — registers a decode layout whose engine_endpoint is a fake handshake server
// run by another user (uid 65534, no kvferry) and whose KV entries, aux rows and state slots
// lie in memory the prefill must never write: the pages of a third (root) process, or the
// prefill's own memory outside anything it registered. It then asks for a room, and prefill
// is given that room's KV to send. The fake server's descriptor names the target's pid and
// those addresses as its regions, and the fake listens on abstract sockets named like an
// engine's. The prefill's engine must refuse the fake (the kernel says who listens on the cma
// socket), the room must not end Success for either side, and no byte may reach the target.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "core/net.h"
#include "forged_peer.h"
#include "unit/pd/pd_fixture.h"
#include "unit/pd/raw_control_client.h"

namespace kvferry::pd {
namespace {

using namespace std::chrono_literals;
using kvferry::testing::contains;
using kvferry::testing::FakeHandshakeServer;
using kvferry::testing::forged_descriptor;
using kvferry::testing::kPage;
using kvferry::testing::SharedPages;
using kvferry::testing::Victim;
using testing::ModelShape;
using testing::TestRank;

// The prefill rank's shape (pd_fixture's ModelShape: 3 layers, K and V, 256 bytes per page of
// an entry), laid out over the two target pages: the six KV entries, two pages each, in page
// 0 (3,072 bytes); four aux rows and four state slots in page 1, the one the forged
// descriptor says is shared memory.
struct ForgedLayout {
  RegisterLayout reg;
  std::vector<kv::PageIndex> dst = {0, 1};
};

ForgedLayout forged_layout(const ModelShape& m, const std::string& engine_endpoint,
                           uint64_t incarnation, uint64_t page0, uint64_t page1) {
  kv::MhaShape shape{m.layers, m.page_tokens, m.total_kv_heads, m.head_dim, m.head_dim, 2, 2};
  const kv::KvLayout layout = testing::must(kv::KvLayout::mha(shape, page0));
  EXPECT_LE(testing::must(kv::KvLayout::region_bytes(shape)), kPage);
  ForgedLayout f;
  f.reg.tp_rank = 0;
  f.reg.tp_size = 1;
  f.reg.total_kv_heads = m.total_kv_heads;
  f.reg.engine_endpoint = engine_endpoint;
  f.reg.incarnation = incarnation;
  f.reg.info = layout.info();
  f.reg.entries.assign(layout.entries().begin(), layout.entries().end());
  f.reg.aux = {{page1, 4 * 64, 64}};
  f.reg.state = {{{page1 + 256, 4 * 256, 256}, 8}};
  return f;
}

class PdForgedEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the attacker as another uid";
  }

  // Runs the whole attack against a fresh prefill rank: `target_pid` and the two pages are
  // what the forged descriptor and the registered layout name. The fake and the target are
  // forked by the caller, before this creates any engine or thread.
  void attack(const FakeHandshakeServer& fake, uint64_t fake_incarnation, int64_t target_pid,
              uint64_t page0, uint64_t page1) {
    ASSERT_EQ(fake.ready(), "ready");
    auto bootstrap = testing::must(BootstrapServer::start({}));
    ModelShape m;
    TestRank p = testing::make_rank("prefill", m, 1, 0);  // no secret on the plane
    PdTimeouts timeouts = testing::fast_timeouts();
    timeouts.heartbeat_timeout = 60s;  // the raw client sends no heartbeats
    PrefillServerOptions po = testing::prefill_options(p, bootstrap->address(), timeouts);
    // A refused registration leaves the connection unregistered: keep it open however long
    // the refusal takes on a loaded machine, so that the attacker's next frames are answered.
    po.control_limits.hello_timeout = 60s;
    auto prefill = testing::must(PrefillServer::create(std::move(po)));

    const uint64_t room = 77, tokens = 2 * m.page_tokens;
    const std::vector<kv::PageIndex> src = {2, 3};
    fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
    fill_rows(p.buffers.aux, 0, room);

    RawControlClient attacker(prefill->control_endpoint());
    auto challenge = attacker.read();
    ASSERT_TRUE(challenge.ok()) << challenge.status().to_string();
    ASSERT_TRUE(std::holds_alternative<AuthChallengeMessage>(*challenge));
    ASSERT_TRUE(std::get<AuthChallengeMessage>(*challenge).nonce.empty());  // no secret here

    // The registration: prefill's engine opens the fake as the decode engine, and the kernel
    // gives it away (pid and uid of the cma socket's listener are not the descriptor's).
    const ForgedLayout forged = forged_layout(m, fake.endpoint(), fake_incarnation, page0, page1);
    ASSERT_TRUE(attacker.send(forged.reg).ok());
    auto registered = attacker.read_skipping_heartbeats();
    ASSERT_TRUE(registered.ok()) << registered.status().to_string();
    ASSERT_TRUE(std::holds_alternative<RegisterReply>(*registered));
    const RegisterReply reply = std::get<RegisterReply>(*registered);
    EXPECT_EQ(reply.code, StatusCode::kUnauthenticated) << reply.reason;
    EXPECT_TRUE(contains(reply.reason, fake.endpoint())) << reply.reason;
    EXPECT_TRUE(contains(reply.reason, "names pid " + std::to_string(target_pid))) << reply.reason;
    EXPECT_TRUE(contains(reply.reason, "(uid 65534)")) << reply.reason;

    // The attacker goes on whatever it was told: it asks for the room, with an aux row and a
    // state slot, then sends an Abort of a room nobody has as a barrier (prefill handles a
    // connection's frames in order and answers it with an AbortAck), so that prefill has
    // handled the request before the sender exists.
    TransferRequest request{room, 1, false, forged.dst};
    request.aux_row = 1;
    request.state_slot = 1;
    ASSERT_TRUE(attacker.send(request).ok());
    constexpr uint64_t kNoSuchRoom = ~uint64_t{0};
    ASSERT_TRUE(attacker.send(AbortMessage{kNoSuchRoom, "barrier"}).ok());
    std::vector<RequestStatusMessage> answers;
    for (bool acked = false; !acked;) {
      auto next = attacker.read_skipping_heartbeats();
      ASSERT_TRUE(next.ok()) << next.status().to_string();
      if (auto* status = std::get_if<RequestStatusMessage>(&*next)) answers.push_back(*status);
      const auto* ack = std::get_if<AbortAck>(&*next);
      acked = ack != nullptr && ack->room == kNoSuchRoom;
    }
    for (const RequestStatusMessage& answer : answers) {
      EXPECT_EQ(answer.room, room);
      EXPECT_EQ(answer.state, RequestState::kFailed) << answer.reason;
    }
    if (reply.code != StatusCode::kOk) {  // an unregistered connection's request is refused
      ASSERT_EQ(answers.size(), 1u);
      EXPECT_EQ(answers[0].code, StatusCode::kFailedPrecondition) << answers[0].reason;
      EXPECT_TRUE(contains(answers[0].reason, "before RegisterLayout")) << answers[0].reason;
    }

    // Prefill is given the room's KV to send. Had the fake been believed, its request filled
    // the room and the sender is WaitingForInput at once, and sends everything; as it is the
    // room has no destination and fails Bootstrapping (fast_timeouts: after 3 s).
    KvSender sender = testing::must(prefill->create_sender(room));
    const RequestState reached = sender.wait_at_least(RequestState::kWaitingForInput, 30s);
    if (reached == RequestState::kWaitingForInput) {
      LastChunkExtras extras{0, 0};
      sender.send(src, &extras).ignore();
      // The room's end, as the attacker hears it.
      auto final_status = attacker.read_status();
      ASSERT_TRUE(final_status.ok()) << final_status.status().to_string();
      EXPECT_EQ(final_status->state, RequestState::kFailed) << final_status->reason;
      EXPECT_EQ(final_status->code, StatusCode::kUnauthenticated) << final_status->reason;
    }
    const RequestState final_state = sender.wait_final(30s);
    EXPECT_EQ(final_state, RequestState::kFailed)
        << "the room to the fake engine ended " << request_state_name(final_state);
    EXPECT_FALSE(sender.failure().ok());
    EXPECT_EQ(prefill->stats().requests_succeeded, 0u);
  }

  std::string sockets_ = "pd-forged-" + std::to_string(::getpid());
};

TEST_F(PdForgedEngine, ALayoutPointingAtAFakeEngineReachesNoThirdProcess) {
  Victim victim;  // forked first: no engine, no thread yet
  const SegmentDescriptor descriptor = forged_descriptor(
      "127.0.0.1:1", victim.pid, victim.pages.addr(0), victim.pages.addr(1), sockets_ + "-v");
  FakeHandshakeServer fake(sockets_ + "-v", descriptor);
  attack(fake, descriptor.incarnation, victim.pid, victim.pages.addr(0), victim.pages.addr(1));
  EXPECT_TRUE(victim.pages.untouched()) << "KV reached the third process";
}

TEST_F(PdForgedEngine, ALayoutPointingAtAFakeEngineReachesNoUnregisteredMemoryOfThePrefill) {
  SharedPages own;  // the prefill process's memory, registered nowhere
  const SegmentDescriptor descriptor =
      forged_descriptor("127.0.0.1:1", ::getpid(), own.addr(0), own.addr(1), sockets_ + "-s");
  FakeHandshakeServer fake(sockets_ + "-s", descriptor);
  attack(fake, descriptor.incarnation, ::getpid(), own.addr(0), own.addr(1));
  EXPECT_TRUE(own.untouched()) << "KV reached the prefill's own unregistered memory";
}

}  // namespace
}  // namespace kvferry::pd
