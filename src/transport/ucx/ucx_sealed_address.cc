#include "transport/ucx/ucx_sealed_address.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <memory>

namespace kvferry::detail {
namespace {

constexpr std::string_view kKeyLabel = "kvferry ucx worker address v1";
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;
constexpr size_t kKeyBytes = 32;

using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)>;

std::array<unsigned char, kKeyBytes> derive_key(std::string_view secret) {
  std::array<unsigned char, kKeyBytes> key{};
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(kKeyLabel.data()), kKeyLabel.size(), key.data(),
       &length);
  return key;
}

std::array<unsigned char, 8> associated_data(uint64_t incarnation) {
  std::array<unsigned char, 8> out{};
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<unsigned char>(incarnation >> (8 * i));
  return out;
}

const unsigned char* bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

}  // namespace

bool is_sealed_worker_address(std::string_view worker_address) {
  return worker_address.starts_with(kSealedAddressMagic);
}

Result<std::string> seal_worker_address(std::string_view secret, std::string_view address,
                                        uint64_t incarnation) {
  const auto key = derive_key(secret);
  const auto aad = associated_data(incarnation);
  std::string out(kSealedAddressMagic);
  out.resize(kSealedAddressMagic.size() + kNonceBytes + address.size() + kTagBytes);
  auto* nonce = reinterpret_cast<unsigned char*>(out.data() + kSealedAddressMagic.size());
  unsigned char* cipher = nonce + kNonceBytes;
  if (RAND_bytes(nonce, static_cast<int>(kNonceBytes)) != 1) {
    return Internal("ucx: RAND_bytes failed while sealing the worker address");
  }
  CipherContext ctx(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
  int length = 0;
  int final_length = 0;
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nonce) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &length, aad.data(), static_cast<int>(aad.size())) !=
          1 ||
      EVP_EncryptUpdate(ctx.get(), cipher, &length, bytes(address),
                        static_cast<int>(address.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), cipher + length, &final_length) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes),
                          cipher + address.size()) != 1) {
    return Internal("ucx: AES-256-GCM failed while sealing the worker address");
  }
  return out;
}

Result<std::string> open_sealed_worker_address(std::string_view secret, std::string_view sealed,
                                               uint64_t incarnation) {
  if (!is_sealed_worker_address(sealed) ||
      sealed.size() < kSealedAddressMagic.size() + kNonceBytes + kTagBytes) {
    return InvalidArgument(fmt::format(
        "ucx: a worker address of {} bytes is not sealed (no {} header of {} bytes)", sealed.size(),
        kSealedAddressMagic, kSealedAddressMagic.size() + kNonceBytes + kTagBytes));
  }
  const auto key = derive_key(secret);
  const auto aad = associated_data(incarnation);
  const unsigned char* nonce = bytes(sealed) + kSealedAddressMagic.size();
  const unsigned char* cipher = nonce + kNonceBytes;
  const size_t cipher_bytes = sealed.size() - kSealedAddressMagic.size() - kNonceBytes - kTagBytes;
  std::array<unsigned char, kTagBytes> tag{};
  std::copy_n(cipher + cipher_bytes, kTagBytes, tag.begin());
  std::string address(cipher_bytes, '\0');
  CipherContext ctx(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
  int length = 0;
  int final_length = 0;
  if (!ctx || EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nonce) != 1 ||
      EVP_DecryptUpdate(ctx.get(), nullptr, &length, aad.data(), static_cast<int>(aad.size())) !=
          1 ||
      EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(address.data()), &length,
                        cipher, static_cast<int>(cipher_bytes)) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(kTagBytes),
                          tag.data()) != 1) {
    return Internal("ucx: AES-256-GCM failed while opening a sealed worker address");
  }
  if (EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(address.data()) + length,
                          &final_length) != 1) {
    return Unauthenticated(fmt::format(
        "ucx: the peer's sealed worker address does not open with this engine's secret for "
        "incarnation {:016x} (the peer does not hold KVFERRY_SECRET, or the address was altered)",
        incarnation));
  }
  return address;
}

}  // namespace kvferry::detail
