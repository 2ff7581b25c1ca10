// Control message codec: round trips, and malformed bytes rejected with ProtocolError.
#include "kvferry/pd/control_message.h"

#include <gtest/gtest.h>

#include <random>

namespace kvferry::pd {
namespace {

RegisterLayout sample_layout() {
  RegisterLayout m;
  m.tp_rank = 1;
  m.tp_size = 2;
  m.total_kv_heads = 8;
  m.engine_endpoint = "127.0.0.1:4000";
  m.incarnation = 77;
  m.info = {16, 4, 128, 2, kv::PageOrder::kLayerMajor};
  m.entries = {kv::contiguous_entry(0x1000, 256, 10, kv::KvRole::kKey, 0),
               kv::contiguous_entry(0x9000, 256, 10, kv::KvRole::kValue, 0)};
  m.aux = {{0x20000, 640, 64}};
  m.state = {{{0x30000, 4096, 512}, 8}};
  return m;
}

TEST(ControlMessage, EveryTypeRoundTrips) {
  std::vector<ControlMessage> messages = {
      sample_layout(),
      RegisterReply{3, 99, StatusCode::kInvalidArgument, "bad"},
      TransferRequest{42, 2, true, {5, 6, 9}, 3, kNoSlot},
      RequestStatusMessage{42, RequestState::kFailed, StatusCode::kTimeout, "slow", std::nullopt},
      AbortMessage{42, "user"},
      AbortAck{42},
      Heartbeat{7, 8},
      AuthChallengeMessage{std::string(32, '\x5a'), 0x1122334455667788},
      AuthProofMessage{std::string(32, '\x11')}};
  for (const ControlMessage& m : messages) {
    std::vector<std::byte> frame = encode_control_message(m);
    auto decoded = decode_control_message(frame);
    ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
    EXPECT_EQ(decoded->index(), m.index());
    EXPECT_EQ(encode_control_message(*decoded), frame);
  }
  auto request =
      std::get<TransferRequest>(*decode_control_message(encode_control_message(messages[2])));
  EXPECT_EQ(request.dst_pages, (std::vector<kv::PageIndex>{5, 6, 9}));
  EXPECT_TRUE(request.dummy);
  EXPECT_EQ(request.aux_row, 3u);
  // The challenge is also the prefill rank's greeting: it says which incarnation listens.
  auto challenge =
      std::get<AuthChallengeMessage>(*decode_control_message(encode_control_message(messages[7])));
  EXPECT_EQ(challenge.incarnation, 0x1122334455667788u);
}

TEST(ControlMessage, RejectsBadMagicVersionTypeAndLength) {
  std::vector<std::byte> frame = encode_control_message(Heartbeat{1, 2});
  auto corrupt = [&](size_t at, std::byte value) {
    std::vector<std::byte> f = frame;
    f[at] = value;
    return decode_control_message(f).status();
  };
  EXPECT_EQ(corrupt(0, std::byte{0}).code(), StatusCode::kProtocolError);      // magic
  EXPECT_EQ(corrupt(4, std::byte{9}).code(), StatusCode::kProtocolError);      // version
  EXPECT_EQ(corrupt(6, std::byte{0}).code(), StatusCode::kProtocolError);      // type 0
  EXPECT_EQ(corrupt(6, std::byte{99}).code(), StatusCode::kProtocolError);     // unknown type
  EXPECT_EQ(corrupt(11, std::byte{0x7f}).code(), StatusCode::kProtocolError);  // over limit
  std::vector<std::byte> longer = frame;
  longer.push_back(std::byte{0});
  EXPECT_EQ(decode_control_message(longer).status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(decode_control_message(std::span(frame).first(5)).status().code(),
            StatusCode::kProtocolError);
}

TEST(ControlMessage, RejectsCountsLargerThanThePayload) {
  std::vector<std::byte> frame = encode_control_message(TransferRequest{1, 1, false, {1, 2}});
  // The page count is the last u32 before the pages: claim a billion pages.
  const size_t count_at = frame.size() - 8 - 4;
  frame[count_at + 3] = std::byte{0x40};
  auto decoded = decode_control_message(frame);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(decoded.status().message().find("page count"), std::string::npos);
}

TEST(ControlMessage, RejectsOutOfRangeEnums) {
  std::vector<std::byte> frame = encode_control_message(
      RequestStatusMessage{1, RequestState::kSuccess, StatusCode::kOk, "", std::nullopt});
  frame[kFrameHeaderBytes + 8] = std::byte{17};  // state
  EXPECT_EQ(decode_control_message(frame).status().code(), StatusCode::kProtocolError);
}

TEST(ControlMessage, EveryTruncationAndRandomBytesAreRejectedWithoutCrashing) {
  std::vector<std::byte> frame = encode_control_message(sample_layout());
  for (size_t n = 0; n < frame.size(); ++n) {
    EXPECT_FALSE(decode_control_message(std::span(frame).first(n)).ok()) << n;
  }
  std::mt19937_64 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::vector<std::byte> f = frame;
    for (int k = 0; k < 4; ++k) f[rng() % f.size()] = static_cast<std::byte>(rng());
    auto decoded = decode_control_message(f);
    if (decoded.ok()) {
      EXPECT_EQ(encode_control_message(*decoded), f);
    }
  }
}

TEST(RequestStatusCell, NeverGoesBackwardsAndFailedIsSticky) {
  RequestStatusCell cell;
  EXPECT_TRUE(cell.advance(RequestState::kTransferring));
  EXPECT_FALSE(cell.advance(RequestState::kWaitingForInput));
  EXPECT_EQ(cell.state(), RequestState::kTransferring);
  EXPECT_TRUE(cell.fail(Timeout("slow")));
  EXPECT_FALSE(cell.advance(RequestState::kSuccess));
  EXPECT_FALSE(cell.fail(Internal("second")));
  EXPECT_EQ(cell.state(), RequestState::kFailed);
  EXPECT_EQ(cell.failure().code(), StatusCode::kTimeout);
  RequestStatusCell done;
  EXPECT_TRUE(done.advance(RequestState::kSuccess));
  EXPECT_FALSE(done.fail(Internal("late")));
  EXPECT_EQ(done.state(), RequestState::kSuccess);
}

}  // namespace
}  // namespace kvferry::pd

namespace kvferry::pd {
namespace {

RequestStatusMessage success_with_digests() {
  RequestStatusMessage m{9, RequestState::kSuccess, StatusCode::kOk, "", std::nullopt};
  m.integrity = PageIntegrity{{{0, 0, 64}, {1, 32, 32}}, {{20, 0x1234}, {22, ~uint64_t{0}}}};
  return m;
}

TEST(ControlMessageIntegrity, PageDigestsRoundTripAndAreOptional) {
  const RequestStatusMessage m = success_with_digests();
  auto decoded = decode_control_message(encode_control_message(m));
  ASSERT_TRUE(decoded.ok()) << decoded.status().to_string();
  const auto& back = std::get<RequestStatusMessage>(*decoded);
  ASSERT_TRUE(back.integrity.has_value());
  EXPECT_EQ(*back.integrity, *m.integrity);
  RequestStatusMessage plain = m;
  plain.integrity.reset();
  auto without = decode_control_message(encode_control_message(plain));
  ASSERT_TRUE(without.ok());
  EXPECT_FALSE(std::get<RequestStatusMessage>(*without).integrity.has_value());
}

TEST(ControlMessageIntegrity, RejectsDigestsOnFailureEmptyFootprintsAndTruncation) {
  RequestStatusMessage failed = success_with_digests();
  failed.state = RequestState::kFailed;
  failed.code = StatusCode::kTimeout;
  EXPECT_EQ(decode_control_message(encode_control_message(failed)).status().code(),
            StatusCode::kProtocolError);
  RequestStatusMessage empty = success_with_digests();
  empty.integrity->footprint.clear();
  EXPECT_EQ(decode_control_message(encode_control_message(empty)).status().code(),
            StatusCode::kProtocolError);
  RequestStatusMessage zero = success_with_digests();
  zero.integrity->footprint[1].bytes = 0;
  EXPECT_EQ(decode_control_message(encode_control_message(zero)).status().code(),
            StatusCode::kProtocolError);
  const std::vector<std::byte> frame = encode_control_message(success_with_digests());
  const size_t payload = frame.size() - kFrameHeaderBytes;
  for (size_t cut = 1; cut < 40; ++cut) {
    std::span<const std::byte> shorter(frame.data() + kFrameHeaderBytes, payload - cut);
    EXPECT_EQ(decode_control_payload(MessageType::kRequestStatus, shorter).status().code(),
              StatusCode::kProtocolError)
        << "payload cut by " << cut;
  }
  // A digest count larger than what is left is refused before anything is allocated.
  std::vector<std::byte> huge(frame.begin() + kFrameHeaderBytes, frame.end());
  const size_t count_at = huge.size() - 2 * 12 - 4;
  huge[count_at + 3] = std::byte{0x7f};
  EXPECT_EQ(decode_control_payload(MessageType::kRequestStatus, huge).status().code(),
            StatusCode::kProtocolError);
}

}  // namespace
}  // namespace kvferry::pd
