#include "core/frame_header.h"

#include <gtest/gtest.h>

#include <array>

#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;

constexpr FrameFormat kFormat{"demo", 0x4F4D4544, 3, 5};  // "DEMO"

std::array<std::byte, kFrameHeaderBytes> encoded(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderBytes> out{};
  encode_frame_header(h, out);
  return out;
}

TEST(FrameHeader, IsMagicVersionTypeLengthLittleEndian) {
  auto out = encoded(make_frame_header(kFormat, 2, 0x01020304));
  const std::array<uint8_t, kFrameHeaderBytes> expected = {'D', 'E', 'M', 'O', 3, 0,
                                                           2,   0,   4,   3,   2, 1};
  for (size_t i = 0; i < kFrameHeaderBytes; ++i) {
    EXPECT_EQ(out[i], static_cast<std::byte>(expected[i])) << "byte " << i;
  }
}

TEST(FrameHeader, DecodesWhatItEncodes) {
  auto out = encoded(make_frame_header(kFormat, 5, 100));
  Result<FrameHeader> h = decode_frame_header(kFormat, out, 100);
  ASSERT_TRUE(h.ok()) << h.status().to_string();
  EXPECT_EQ(h->type, 5);
  EXPECT_EQ(h->payload_bytes, 100u);
}

TEST(FrameHeader, RejectsEachBadFieldAsAProtocolErrorNamingIt) {
  struct Case {
    FrameHeader header;
    const char* expected;
  };
  const Case cases[] = {
      {{0x12345678, 3, 1, 0}, "demo frame magic 305419896"},
      {{kFormat.magic, 9, 1, 0}, "demo protocol version 9"},
      {{kFormat.magic, 3, 0, 0}, "demo message type 0"},
      {{kFormat.magic, 3, 6, 0}, "demo message type 6"},
      {{kFormat.magic, 3, 1, 11}, "demo payload of 11 bytes exceeds the limit of 10"},
  };
  for (const Case& c : cases) {
    auto out = encoded(c.header);
    Result<FrameHeader> h = decode_frame_header(kFormat, out, 10);
    ASSERT_FALSE(h.ok()) << c.expected;
    EXPECT_EQ(h.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(contains(h.status().message(), c.expected)) << h.status().message();
  }
}

TEST(FrameHeader, RejectsAShortHeader) {
  std::array<std::byte, 5> out{};
  Result<FrameHeader> h = decode_frame_header(kFormat, out, 10);
  ASSERT_FALSE(h.ok());
  EXPECT_TRUE(contains(h.status().message(), "header of 5 bytes")) << h.status().message();
}

}  // namespace
}  // namespace kvferry
