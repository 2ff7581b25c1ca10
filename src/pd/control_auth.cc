#include "pd/control_auth.h"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "core/auth.h"

namespace kvferry::pd {
namespace {

std::span<const std::byte> as_bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

uint64_t payload_bytes(const ControlMessage& message) {
  return encode_control_message(message).size() - kFrameHeaderBytes;
}

uint32_t capped(uint64_t bytes) {
  return static_cast<uint32_t>(std::min<uint64_t>(bytes, kMaxControlPayloadBytes));
}

}  // namespace

Result<AuthChallengeMessage> make_control_challenge(const std::optional<std::string>& secret,
                                                    uint64_t incarnation) {
  AuthChallengeMessage challenge;
  challenge.incarnation = incarnation;
  if (!secret) return challenge;
  KVF_ASSIGN_OR_RETURN(AuthNonce nonce, make_auth_nonce());
  challenge.nonce.assign(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  return challenge;
}

bool control_proof_matches(const std::string& secret, const AuthChallengeMessage& challenge,
                           const AuthProofMessage& proof) {
  return !challenge.nonce.empty() &&
         auth_proof_matches(auth_proof(secret, as_bytes(challenge.nonce)), as_bytes(proof.proof));
}

Result<AuthChallengeMessage> read_control_challenge(int fd, const std::string& peer_name,
                                                    Clock::time_point deadline) {
  std::byte header_bytes[kFrameHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(fd, header_bytes, deadline));
  KVF_ASSIGN_OR_RETURN(FrameHeader header, decode_frame_header(header_bytes));
  // The challenge is tiny (nonce string, incarnation): a larger claim is refused before
  // anything is allocated for it.
  if (header.type != MessageType::kAuthChallenge ||
      header.payload_bytes > sizeof(uint32_t) + kMaxAuthBytes + sizeof(uint64_t)) {
    return ProtocolError(peer_name + " did not open with an AuthChallenge (got " +
                         std::string(message_type_name(header.type)) + ", " +
                         std::to_string(header.payload_bytes) + " bytes)");
  }
  std::vector<std::byte> payload(header.payload_bytes);
  KVF_RETURN_IF_ERROR(recv_all(fd, payload, deadline));
  KVF_ASSIGN_OR_RETURN(ControlMessage message, decode_control_payload(header.type, payload));
  return std::get<AuthChallengeMessage>(std::move(message));
}

Status answer_control_challenge(int fd, const std::optional<std::string>& secret,
                                const std::string& peer_name, Clock::time_point deadline) {
  KVF_ASSIGN_OR_RETURN(AuthChallengeMessage challenge,
                       read_control_challenge(fd, peer_name, deadline));
  if (challenge.nonce.empty()) return Status::Ok();  // authentication off on that prefill
  if (!secret) {
    return Unauthenticated(peer_name +
                           " requires authentication; no secret is configured here "
                           "(EngineOptions::secret or KVFERRY_SECRET)");
  }
  AuthProof proof = auth_proof(*secret, as_bytes(challenge.nonce));
  std::vector<std::byte> frame = encode_control_message(
      AuthProofMessage{std::string(reinterpret_cast<const char*>(proof.data()), proof.size())});
  return send_all(fd, frame, deadline);
}

uint32_t max_proof_payload_bytes() {
  return capped(payload_bytes(AuthProofMessage{std::string(kMaxAuthBytes, '\0')}));
}

uint32_t max_registration_payload_bytes(const RankBuffers& own) {
  RegisterLayout largest;
  largest.engine_endpoint.assign(kMaxEndpointBytes, 'x');
  largest.entries.resize(own.layout.num_entries());
  largest.aux = own.aux;
  largest.state = own.state;
  return capped(payload_bytes(largest) + kRegistrationSlackBytes);
}

uint32_t max_reply_payload_bytes() {
  RegisterReply longest;
  longest.reason.assign(kMaxReasonBytes, 'x');
  return capped(std::max(payload_bytes(longest), payload_bytes(Heartbeat{})));
}

}  // namespace kvferry::pd
