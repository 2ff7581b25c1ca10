// Shared-secret authentication for every kvferry plane: the p2p handshake, tcp data
// connections, the shm descriptor-passing socket, the PD control channel and the bootstrap
// HTTP server all prove the same secret (EngineOptions::secret, else KVFERRY_SECRET).
//
// Challenge-response (connections): the accepting side sends a random 32-byte nonce, the
// connecting side answers auth_proof(secret, nonce) = HMAC-SHA256(secret, nonce) (OpenSSL
// libcrypto), and the accepting side compares in constant time (auth_proof_matches). A peer
// that cannot answer is refused before it can send anything else. A fresh nonce per
// connection makes a recorded proof useless on another connection.
//
// Signed requests (HTTP, one message without a round trip for a challenge): auth_signature
// is HMAC-SHA256 over a caller-built message (method, path, body, a timestamp and a nonce,
// see pd/bootstrap_auth.h); the receiver bounds the timestamp and remembers nonces.
//
// To add authentication to another transport (ucx): have the accepting side send
// make_auth_nonce() over a channel both sides already have, answer with
// auth_proof(*resolved secret, nonce), and check with auth_proof_matches; refuse with
// Unauthenticated otherwise.
//
// Thread-safety: pure functions (OpenSSL's one-shot HMAC and RAND_bytes are thread-safe).
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry {

using AuthNonce = std::array<std::byte, 32>;
using AuthProof = std::array<std::byte, 32>;

// The environment variable every kvferry process reads its secret from when none is given.
inline constexpr const char* kSecretEnvVariable = "KVFERRY_SECRET";

// The secret in force: `configured` when set, else KVFERRY_SECRET when set and non-empty,
// else none (authentication off). InvalidArgument for a configured empty secret.
Result<std::optional<std::string>> resolve_secret(const std::optional<std::string>& configured);

Result<AuthNonce> make_auth_nonce();
AuthProof auth_proof(std::string_view secret, std::span<const std::byte> nonce);
bool auth_proof_matches(const AuthProof& expected, std::span<const std::byte> received);

// HMAC-SHA256(secret, message), for signed requests.
AuthProof auth_signature(std::string_view secret, std::string_view message);

// Lower-case hex of `bytes`, and its inverse (nullopt for anything that is not even-length hex).
std::string to_hex(std::span<const std::byte> bytes);
std::optional<std::string> from_hex(std::string_view hex);

}  // namespace kvferry
