#include "metadata/segment_descriptor.h"

#include <gtest/gtest.h>

#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;

SegmentDescriptor sample() {
  SegmentDescriptor d;
  d.name = "decode-0";
  d.endpoint = "127.0.0.1:7000";
  d.incarnation = 0xfeedfacecafebeefull;
  d.host_id = "boot/pid:[1]";
  d.pid = 4242;
  d.transports = TransportSet{TransportKind::kLocal, TransportKind::kShm};
  d.version = 3;
  d.regions.push_back({0x1000, 0x2000, {}, ShmBacking{7, 0, 0x4000, 99}, std::nullopt});
  d.regions.push_back({0x10000, 64, {}, std::nullopt, std::nullopt});
  return d;
}

TEST(SegmentDescriptor, RoundTripsEveryField) {
  auto parsed = parse_segment_descriptor(serialize_segment_descriptor(sample()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const SegmentDescriptor& d = *parsed;
  EXPECT_EQ(d.name, "decode-0");
  EXPECT_EQ(d.incarnation, 0xfeedfacecafebeefull);
  EXPECT_EQ(d.pid, 4242);
  EXPECT_EQ(d.transports, (TransportSet{TransportKind::kLocal, TransportKind::kShm}));
  ASSERT_EQ(d.regions.size(), 2u);
  ASSERT_TRUE(d.regions[0].shm.has_value());
  EXPECT_EQ(d.regions[0].shm->fd, 7);
  EXPECT_EQ(d.regions[0].shm->inode, 99u);
  EXPECT_FALSE(d.regions[1].shm.has_value());
}

TEST(SegmentDescriptor, RejectsMalformedInputNamingTheProblem) {
  struct Case {
    std::string json;
    std::string expect;
  };
  std::string good = serialize_segment_descriptor(sample());
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  std::vector<Case> cases = {
      {"", "not valid JSON"},
      {"[]", "not an object"},
      {replace("\"format\":1", "\"format\":2"), "format 2"},
      {replace("\"pid\":4242", "\"pid\":\"x\""), "'pid'"},
      {replace("\"length\":64", "\"length\":0"), "length 0"},
      {replace("\"length\":64", "\"length\":-5"), "'length'"},
      {replace("\"addr\":65536", "\"addr\":18446744073709551600"), "wraps"},
      {replace("\"addr\":65536", "\"addr\":4096"), "overlap"},
      {replace("\"file_bytes\":16384", "\"file_bytes\":16"), "runs past"},
      {replace("\"regions\":[", "\"regions\":3,\"x\":["), "'regions'"},
      {replace("\"pid\":4242", "\"pid\":18446744073709551615"), "'pid'"},
  };
  for (const Case& c : cases) {
    auto r = parse_segment_descriptor(c.json);
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(contains(r.status().message(), c.expect)) << r.status().message();
  }
}

// Found while fuzzing: the error message for a non-integer field used to dump() the value,
// which recurses per nesting level, so deep nesting overflowed the stack.
TEST(SegmentDescriptor, RejectsDeeplyNestedFieldWithoutOverflowingTheStack) {
  constexpr size_t kDepth = 1'000'000;
  std::string good = serialize_segment_descriptor(sample());
  std::string nested = std::string(kDepth, '[') + std::string(kDepth, ']');
  good.replace(good.find("\"pid\":4242"), 10, "\"pid\":" + nested);
  auto r = parse_segment_descriptor(good);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_TRUE(contains(r.status().message(), "'pid' is not a 64-bit signed integer: an array"))
      << r.status().message().substr(0, 200);
}

TEST(SegmentDescriptor, RejectsOversizedInput) {
  std::string big(kMaxDescriptorBytes + 1, ' ');
  auto r = parse_segment_descriptor(big);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(contains(r.status().message(), "exceeds"));
}

TEST(SegmentDescriptor, IgnoresTransportsItDoesNotKnow) {
  std::string s = serialize_segment_descriptor(sample());
  s.replace(s.find("\"transports\":["), 14, "\"transports\":[\"warp\",");
  auto r = parse_segment_descriptor(s);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->transports.contains(TransportKind::kShm));
}

}  // namespace
}  // namespace kvferry
