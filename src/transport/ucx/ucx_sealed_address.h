// Sealing the ucx worker address with the shared secret (KVFERRY_SECRET). UCX authenticates
// nobody, and on its emulated paths a peer reaching the worker can write anywhere in the
// process; so with a secret set, the engine never publishes its worker address in the clear
// (descriptors travel through the p2p handshake, etcd or redis, readable by whoever reaches
// them), and never uses a peer's address that was not sealed with the same secret.
//
// A sealed address is kSealedAddressMagic, a random 12-byte nonce, the AES-256-GCM
// ciphertext of the address and its 16-byte tag (OpenSSL libcrypto). The key is
// HMAC-SHA256(secret, "kvferry ucx worker address v1"); the associated data is the
// publishing engine's incarnation (little-endian u64), so an address sealed by one
// incarnation does not open for another. Opening it proves the sealer held the secret and
// yields the address; nothing else about the peer is trusted more for it.
//
// Thread-safety: pure functions (OpenSSL's EVP calls on a local context, RAND_bytes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvferry/status.h"

namespace kvferry::detail {

inline constexpr std::string_view kSealedAddressMagic = "KVFSEAL1";

// Whether `worker_address` (as a descriptor carries it) is a sealed one.
bool is_sealed_worker_address(std::string_view worker_address);

Result<std::string> seal_worker_address(std::string_view secret, std::string_view address,
                                        uint64_t incarnation);

// The address inside; Unauthenticated when it was not sealed with this secret for this
// incarnation (or was altered), InvalidArgument when it is no sealed address at all.
Result<std::string> open_sealed_worker_address(std::string_view secret, std::string_view sealed,
                                               uint64_t incarnation);

}  // namespace kvferry::detail
