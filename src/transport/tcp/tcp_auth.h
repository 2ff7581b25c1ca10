// Shared-secret authentication for kvferry connections: the accepting side sends a random
// nonce, the connecting side answers HMAC-SHA256(secret, nonce) (OpenSSL libcrypto), and
// the accepting side compares in constant time. A peer that cannot answer is refused
// before it can send anything else.
//
// Thread-safety: pure functions (OpenSSL's one-shot HMAC and RAND_bytes are thread-safe).
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry {

using AuthNonce = std::array<std::byte, 32>;
using AuthProof = std::array<std::byte, 32>;

Result<AuthNonce> make_auth_nonce();
AuthProof auth_proof(std::string_view secret, std::span<const std::byte> nonce);
bool auth_proof_matches(const AuthProof& expected, std::span<const std::byte> received);

}  // namespace kvferry
