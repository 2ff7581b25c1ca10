// The sealed ucx worker address: only the secret's holders can read it, and only an address
// sealed with the secret for the incarnation the peer advertises opens.
#include "transport/ucx/ucx_sealed_address.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace kvferry::detail {
namespace {

using testing::must;

constexpr uint64_t kIncarnation = 0x1122334455667788ull;
const std::string kAddress("\x01\x02worker address bytes\x00\xff", 24);

TEST(UcxSealedAddress, OpensWithTheSecretAndHidesTheAddress) {
  const std::string sealed = must(seal_worker_address("s3cret", kAddress, kIncarnation));
  EXPECT_TRUE(is_sealed_worker_address(sealed));
  EXPECT_EQ(sealed.find("worker address"), std::string::npos) << "the address is in the clear";
  EXPECT_EQ(must(open_sealed_worker_address("s3cret", sealed, kIncarnation)), kAddress);
  // A fresh nonce each time: two seals of one address differ.
  EXPECT_NE(must(seal_worker_address("s3cret", kAddress, kIncarnation)), sealed);
}

TEST(UcxSealedAddress, AnotherSecretOrIncarnationOrAlteredByteIsUnauthenticated) {
  const std::string sealed = must(seal_worker_address("s3cret", kAddress, kIncarnation));
  EXPECT_EQ(open_sealed_worker_address("other", sealed, kIncarnation).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(open_sealed_worker_address("s3cret", sealed, kIncarnation + 1).status().code(),
            StatusCode::kUnauthenticated);
  for (size_t i = kSealedAddressMagic.size(); i < sealed.size(); ++i) {
    std::string altered = sealed;
    altered[i] = static_cast<char>(altered[i] ^ 0x01);
    EXPECT_EQ(open_sealed_worker_address("s3cret", altered, kIncarnation).status().code(),
              StatusCode::kUnauthenticated)
        << "byte " << i;
  }
}

TEST(UcxSealedAddress, UnsealedOrTruncatedInputIsRefusedNamingItsSize) {
  Result<std::string> plain = open_sealed_worker_address("s3cret", kAddress, kIncarnation);
  EXPECT_EQ(plain.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::contains(plain.status().message(), "24 bytes")) << plain.status().message();
  const std::string sealed = must(seal_worker_address("s3cret", kAddress, kIncarnation));
  for (size_t n = 0; n < sealed.size(); ++n) {
    EXPECT_FALSE(open_sealed_worker_address("s3cret", sealed.substr(0, n), kIncarnation).ok())
        << "prefix of " << n << " bytes";
  }
}

}  // namespace
}  // namespace kvferry::detail
