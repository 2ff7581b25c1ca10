// Authentication of a PD control connection (docs/PROTOCOL.md, "Control frames"): the prefill
// side sends AuthChallenge as the first frame of every connection — a 32-byte nonce when it has
// a secret, empty when it has none — and accepts nothing but a matching AuthProof before it.
// The decode side reads that challenge before its channel starts and answers it.
//
// The secret is the engine's (TransferEngine::secret(): EngineOptions::secret or
// KVFERRY_SECRET), so a PD deployment has one secret for every plane.
//
// Thread-safety: free functions with no shared state.
#pragma once

#include <optional>
#include <string>

#include "core/net.h"
#include "kvferry/pd/control_message.h"
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

}  // namespace kvferry::pd
