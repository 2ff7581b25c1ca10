// The PD plane against a hostile client on its control port: with a secret nothing is
// accepted before the proof; without one, an Abort from a connection that did not register
// the room leaves the room alone. Legitimate requests alongside succeed, every page verified.
#include <gtest/gtest.h>

#include <vector>

#include "core/auth.h"
#include "core/net.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::pd {
namespace {

using namespace std::chrono_literals;
using testing::ModelShape;
using testing::TestRank;

constexpr const char* kSecret = "pd-plane-secret";

// A raw TCP client speaking control frames to a prefill's control listener.
class RawControlClient {
 public:
  explicit RawControlClient(const std::string& endpoint)
      : fd_(testing::must(connect_tcp(testing::must(parse_endpoint(endpoint)), deadline()))) {}
  Status send(const ControlMessage& m) {
    return send_all(fd_.get(), encode_control_message(m), deadline());
  }
  Result<ControlMessage> read() {
    std::byte header[kFrameHeaderBytes];
    KVF_RETURN_IF_ERROR(recv_all(fd_.get(), header, deadline()));
    KVF_ASSIGN_OR_RETURN(FrameHeader h, decode_frame_header(header));
    std::vector<std::byte> payload(h.payload_bytes);
    KVF_RETURN_IF_ERROR(recv_all(fd_.get(), payload, deadline()));
    return decode_control_payload(h.type, payload);
  }
  // The next frame that is not a Heartbeat.
  Result<ControlMessage> read_skipping_heartbeats() {
    for (int i = 0; i < 100; ++i) {
      KVF_ASSIGN_OR_RETURN(ControlMessage m, read());
      if (!std::holds_alternative<Heartbeat>(m)) return m;
    }
    return Internal("only heartbeats");
  }

 private:
  static Clock::time_point deadline() { return Clock::now() + 5s; }
  Fd fd_;
};

// Prefill and decode of one room; the room moves its pages once the sender sends.
struct OneRoom {
  OneRoom(const std::string& bootstrap, const std::optional<std::string>& secret, uint64_t room_id)
      : p(testing::make_rank("prefill", m, 1, 0, secret)),
        d(testing::make_rank("decode", m, 1, 0, secret)),
        prefill(testing::make_prefill(p, bootstrap)),
        decode(testing::make_decode(d)),
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

}  // namespace
}  // namespace kvferry::pd
