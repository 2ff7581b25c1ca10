// Authentication of a PD control connection (docs/PROTOCOL.md, "Control frames"): the prefill
// side sends AuthChallenge as the first frame of every connection — a 32-byte nonce when it has
// a secret, empty when it has none — and accepts nothing but a matching AuthProof before it.
// The decode side reads that challenge before its channel starts and answers it.
//
// The secret is the engine's (TransferEngine::secret(): EngineOptions::secret or
// KVFERRY_SECRET), so a PD deployment has one secret for every plane.
//
// Until a connection has earned more, its frames are capped at the largest frame it may
// legitimately send next (ControlChannel::limit_payload_bytes): before the proof of the secret,
// an AuthProof; before its registration, a RegisterLayout of the prefill's layout; on the decode
// side, before the RegisterReply, that reply. So a client that knows nothing costs a prefill a
// few kilobytes per connection, whatever length its frame headers claim. The caps are the
// encoded sizes of the largest such messages: they follow the message format.
//
// Thread-safety: free functions with no shared state.
#pragma once

#include <optional>
#include <string>

#include "core/net.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/pd_options.h"
#include "kvferry/status.h"

namespace kvferry::pd {

// Prefill side: the challenge to send on a new connection (empty nonce without a secret),
// greeting with the rank's engine `incarnation`.
Result<AuthChallengeMessage> make_control_challenge(const std::optional<std::string>& secret,
                                                    uint64_t incarnation);

// Prefill side: whether `proof` answers `challenge` for `secret`.
bool control_proof_matches(const std::string& secret, const AuthChallengeMessage& challenge,
                           const AuthProofMessage& proof);

// Reads the first frame of a connection to a prefill control listener, which must be its
// AuthChallenge (decode, and the bootstrap server asking a rank for its incarnation).
// PeerUnreachable/Timeout/ProtocolError when no proper challenge arrives before `deadline`.
// `peer_name` is for messages.
Result<AuthChallengeMessage> read_control_challenge(int fd, const std::string& peer_name,
                                                    Clock::time_point deadline);

// Decode side, before the channel's reader starts: reads the challenge from `fd` and, when it
// is not empty, sends the proof. Unauthenticated when prefill asks for a secret and none is
// configured here; PeerUnreachable/Timeout/ProtocolError when no proper challenge arrives
// before `deadline`. `peer_name` is for messages.
Status answer_control_challenge(int fd, const std::optional<std::string>& secret,
                                const std::string& peer_name, Clock::time_point deadline);

// Room beyond the exact RegisterLayout of a prefill's layout: aux and state lists that a prefill
// without its own ignores (some 2,700 buffers), and a decode with a few more of them than the
// prefill, are still refused by their content (with a RegisterReply saying why), not by size.
inline constexpr uint32_t kRegistrationSlackBytes = uint32_t{64} << 10;

// Prefill side, before the proof of the secret: the largest AuthProof payload (68 bytes).
uint32_t max_proof_payload_bytes();

// Prefill side, before the connection registered: the largest RegisterLayout payload for a
// prefill whose buffers are `own` (the same number of entries, since any other is refused; the
// same aux and state lists; the longest engine endpoint) plus kRegistrationSlackBytes, at most
// kMaxControlPayloadBytes.
uint32_t max_registration_payload_bytes(const RankBuffers& own);

// Decode side, before the RegisterReply: the largest RegisterReply (the longest reason) or
// Heartbeat payload, the frames a prefill sends before it.
uint32_t max_reply_payload_bytes();

}  // namespace kvferry::pd
