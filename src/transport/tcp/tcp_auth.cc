#include "transport/tcp/tcp_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace kvferry {

Result<AuthNonce> make_auth_nonce() {
  AuthNonce nonce;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), nonce.size()) != 1) {
    return Internal("RAND_bytes failed to produce an authentication nonce");
  }
  return nonce;
}

AuthProof auth_proof(std::string_view secret, std::span<const std::byte> nonce) {
  AuthProof proof{};
  unsigned int length = proof.size();
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(nonce.data()), nonce.size(),
       reinterpret_cast<unsigned char*>(proof.data()), &length);
  return proof;
}

bool auth_proof_matches(const AuthProof& expected, std::span<const std::byte> received) {
  return received.size() == expected.size() &&
         CRYPTO_memcmp(expected.data(), received.data(), expected.size()) == 0;
}

}  // namespace kvferry
