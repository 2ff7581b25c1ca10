#include "core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>

namespace kvferry {

Result<std::optional<std::string>> resolve_secret(const std::optional<std::string>& configured) {
  std::optional<std::string> secret = configured;
  if (!secret) {
    if (const char* env = std::getenv(kSecretEnvVariable); env != nullptr && *env != '\0') {
      secret = env;
    }
  }
  if (secret && secret->empty()) {
    return InvalidArgument("secret is empty; leave it unset to turn authentication off");
  }
  return secret;
}

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

AuthProof auth_signature(std::string_view secret, std::string_view message) {
  return auth_proof(secret, {reinterpret_cast<const std::byte*>(message.data()), message.size()});
}

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    out.push_back(kDigits[static_cast<unsigned>(b) >> 4]);
    out.push_back(kDigits[static_cast<unsigned>(b) & 0xF]);
  }
  return out;
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = digit(hex[i]);
    int lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
  }
  return out;
}

}  // namespace kvferry
