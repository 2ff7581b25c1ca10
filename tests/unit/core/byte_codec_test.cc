#include "core/byte_codec.h"

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvferry {
namespace {

std::vector<std::byte> bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(static_cast<std::byte>(v));
  return out;
}

TEST(ByteWriter, WritesLittleEndianWhateverTheHost) {
  ByteWriter w;
  w.put(uint32_t{0x11223344});
  w.put(uint16_t{0xAABB});
  w.put(int64_t{-2});
  w.put(uint8_t{7});
  EXPECT_EQ(w.bytes(), bytes({0x44, 0x33, 0x22, 0x11, 0xBB, 0xAA, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF,
                              0xFF, 0xFF, 0xFF, 7}));
}

TEST(ByteWriter, StringsAreAU32LengthThenTheirBytes) {
  ByteWriter w;
  w.put_string("ab");
  EXPECT_EQ(w.bytes(), bytes({2, 0, 0, 0, 'a', 'b'}));
}

TEST(ByteWriter, PatchOverwritesALengthWrittenEarlier) {
  ByteWriter w;
  w.put(uint32_t{0});
  w.put(uint16_t{9});
  w.patch(0, static_cast<uint32_t>(w.size()));
  EXPECT_EQ(std::move(w).take(), bytes({6, 0, 0, 0, 9, 0}));
}

TEST(FixedByteWriter, RefusesAPutThatDoesNotFitAndWritesNothingOfIt) {
  std::array<std::byte, 6> out{};
  FixedByteWriter w(out);
  EXPECT_TRUE(w.put(uint32_t{0x01020304}));
  EXPECT_FALSE(w.put(uint32_t{0xFFFFFFFF}));
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.written(), 4u);
  EXPECT_EQ(std::vector<std::byte>(out.begin(), out.end()), bytes({4, 3, 2, 1, 0, 0}));
}

TEST(ByteReader, ReadsBackWhatTheWriterWrote) {
  ByteWriter w;
  w.put(uint64_t{0xfeedfacecafebeef});
  w.put(int32_t{-5});
  w.put_string("hello");
  ByteReader r(w.bytes());
  uint64_t a = 0;
  int32_t b = 0;
  std::string s;
  ASSERT_TRUE(r.get(a) && r.get(b) && r.get_string(s, 16));
  EXPECT_EQ(a, 0xfeedfacecafebeefull);
  EXPECT_EQ(b, -5);
  EXPECT_EQ(s, "hello");
  EXPECT_EQ(r.remaining(), 0u);
  EXPECT_TRUE(r.ok());
}

TEST(ByteReader, NeverReadsPastItsSpanAndLatchesTheFailure) {
  const auto in = bytes({1, 2, 3});
  ByteReader r(in);
  uint32_t v = 77;
  EXPECT_FALSE(r.get(v));
  EXPECT_EQ(v, 77u);  // untouched
  EXPECT_FALSE(r.ok());
  uint8_t small = 0;
  EXPECT_TRUE(r.get(small));  // what does fit can still be read, but ok() stays false
  EXPECT_EQ(small, 1);
  EXPECT_FALSE(r.ok());
}

TEST(ByteReader, RefusesAStringLongerThanItsLimitOrThanWhatIsLeft) {
  ByteWriter w;
  w.put_string("toolong");
  std::string s;
  ByteReader limited(w.bytes());
  EXPECT_FALSE(limited.get_string(s, 3));
  auto truncated = bytes({100, 0, 0, 0, 'x'});
  ByteReader short_input(truncated);
  EXPECT_FALSE(short_input.get_string(s, 1000));
  EXPECT_TRUE(s.empty());
}

TEST(ByteReader, RefusesACountThatCannotFitInWhatIsLeft) {
  ByteWriter w;
  w.put(uint32_t{0xFFFFFFFF});  // a hostile count ...
  w.put(uint64_t{1});           // ... followed by 8 bytes
  ByteReader r(w.bytes());
  uint32_t n = 0;
  EXPECT_FALSE(r.get_count(n, 8));
  ByteWriter honest;
  honest.put(uint32_t{1});
  honest.put(uint64_t{1});
  ByteReader ok(honest.bytes());
  EXPECT_TRUE(ok.get_count(n, 8));
  EXPECT_EQ(n, 1u);
}

TEST(ByteReader, SkipStepsOverReservedBytesWithinBounds) {
  const auto in = bytes({0, 0, 5});
  ByteReader r(in);
  uint8_t v = 0;
  EXPECT_TRUE(r.skip(2) && r.get(v));
  EXPECT_EQ(v, 5);
  EXPECT_FALSE(r.skip(1));
}

}  // namespace
}  // namespace kvferry
