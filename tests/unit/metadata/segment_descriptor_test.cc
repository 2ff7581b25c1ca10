#include "metadata/segment_descriptor.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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
  d.regions.push_back(
      {0x1000, 0x2000, {}, ShmBacking{7, 0, 0x4000, 99, 0x2000, 1, 5}, std::nullopt});
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
  EXPECT_EQ(d.regions[0].shm->guard_offset, 0x2000u);
  EXPECT_EQ(d.regions[0].shm->guard_slot, 1u);
  EXPECT_EQ(d.regions[0].shm->generation, 5u);
  EXPECT_FALSE(d.regions[1].shm.has_value());
}

// The regions are written without the JSON library: the text must be exactly what the
// library writes for the same document (its own dump of the parsed text gives it back), for
// every kind of region, and a string that looks like the regions key must not move them.
TEST(SegmentDescriptor, WritesWhatTheJsonLibraryWrites) {
  SegmentDescriptor d = sample();
  d.name = R"(tricky "regions":[] name)";
  d.tcp_endpoint = "127.0.0.1:7001";
  RegionDescriptor device{
      0x7f0000000000, 1 << 20, {MemoryLocation::Kind::kCuda, 3}, std::nullopt, CudaIpcBacking{}};
  device.cuda->handle.fill(0xab);
  device.cuda->allocation_offset = 4096;
  device.cuda->allocation_bytes = 2 << 20;
  device.ucx_rkey = std::string("\x00\x01\xff", 3);
  d.regions.push_back(device);
  d.ucx = UcxEndpoint{std::string("addr"), true};
  const std::string text = serialize_segment_descriptor(d);
  const nlohmann::json doc = nlohmann::json::parse(text);
  EXPECT_EQ(doc.dump(), text);
  EXPECT_EQ(doc["name"], d.name);
  ASSERT_EQ(doc["regions"].size(), 3u);
  EXPECT_EQ(doc["regions"][1]["device"], -1);
  EXPECT_EQ(doc["regions"][2]["device"], 3);
  EXPECT_EQ(doc["regions"][2]["cuda"]["allocation_bytes"], 2u << 20);
  auto parsed = parse_segment_descriptor(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_EQ(parsed->regions.size(), 3u);
  EXPECT_EQ(parsed->regions[2].cuda, device.cuda);
  EXPECT_EQ(parsed->regions[2].ucx_rkey, device.ucx_rkey);
  EXPECT_EQ(parsed->regions[0].shm->file_bytes, 0x4000u);
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
      {replace("\"format\":3", "\"format\":2"), "format 2"},
      {replace("\"pid\":4242", "\"pid\":\"x\""), "'pid'"},
      {replace("\"length\":64", "\"length\":0"), "length 0"},
      {replace("\"length\":64", "\"length\":-5"), "'length'"},
      {replace("\"addr\":65536", "\"addr\":18446744073709551600"), "wraps"},
      {replace("\"addr\":65536", "\"addr\":4096"), "overlap"},
      {replace("\"file_bytes\":16384", "\"file_bytes\":16"), "runs past"},
      {replace("\"generation\":5", "\"generation\":0"), "generation"},
      {replace("\"guard_offset\":8192", "\"guard_offset\":4096"), "guard word"},
      {replace("\"guard_offset\":8192", "\"guard_offset\":8193"), "guard word"},
      {replace("\"guard_slot\":1", "\"guard_slot\":1024"), "guard word"},
      {replace("\"guard_slot\":1", "\"guard_slot\":-1"), "guard_slot"},
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

// A forged descriptor within the byte bound that lists more regions than any engine may
// register is refused, naming the count, before any region of it is read.
TEST(SegmentDescriptor, RejectsMoreRegionsThanAnEngineRegisters) {
  SegmentDescriptor d = sample();
  d.regions.clear();
  for (uint64_t i = 0; i <= kMaxDescriptorRegions; ++i) {
    RegionDescriptor region;
    region.addr = 0x10000 + i * 64;
    region.length = 64;
    d.regions.push_back(region);
  }
  const std::string json = serialize_segment_descriptor(d);
  ASSERT_LE(json.size(), kMaxDescriptorBytes);
  auto r = parse_segment_descriptor(json);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_TRUE(contains(r.status().message(),
                       std::to_string(kMaxDescriptorRegions + 1) + " regions exceed the limit"))
      << r.status().message().substr(0, 200);
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

namespace kvferry {
namespace {

SegmentDescriptor with_ucx() {
  SegmentDescriptor d;
  d.name = "prefill-0";
  d.endpoint = "10.0.0.1:7000";
  d.incarnation = 5;
  d.host_id = "boot/pid:[1]";
  d.pid = 7;
  d.transports = TransportSet{TransportKind::kUcx};
  d.ucx = UcxEndpoint{std::string("\x01\x00\xff\x7f", 4), true};
  RegionDescriptor r{0x1000,       0x2000,       {},
                     std::nullopt, std::nullopt, std::string("\xab\x00\x01", 3)};
  d.regions.push_back(r);
  return d;
}

TEST(SegmentDescriptorUcx, WorkerAddressAndRkeysRoundTripAsBytes) {
  auto parsed = parse_segment_descriptor(serialize_segment_descriptor(with_ucx()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  ASSERT_TRUE(parsed->ucx.has_value());
  EXPECT_EQ(*parsed->ucx, *with_ucx().ucx);
  EXPECT_TRUE(parsed->transports.contains(TransportKind::kUcx));
  ASSERT_EQ(parsed->regions.size(), 1u);
  EXPECT_EQ(parsed->regions[0].ucx_rkey, std::string("\xab\x00\x01", 3));
  SegmentDescriptor plain = with_ucx();
  plain.ucx.reset();
  plain.regions[0].ucx_rkey.clear();
  auto without = parse_segment_descriptor(serialize_segment_descriptor(plain));
  ASSERT_TRUE(without.ok()) << without.status().to_string();
  EXPECT_FALSE(without->ucx.has_value());
  EXPECT_TRUE(without->regions[0].ucx_rkey.empty());
}

TEST(SegmentDescriptorUcx, OversizedOrMalformedUcxFieldsAreRejectedNamingThem) {
  const std::string good = serialize_segment_descriptor(with_ucx());
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) s.replace(at, from.size(), to);
    return s;
  };
  struct Case {
    std::string json;
    std::string expect;
  };
  const std::string big_rkey(2 * (kMaxUcxRkeyBytes + 1), 'a');
  const std::string big_address(2 * (kMaxUcxWorkerAddressBytes + 1), '0');
  const std::vector<Case> cases = {
      {replace("\"ucx_rkey\":\"ab0001\"", "\"ucx_rkey\":\"" + big_rkey + "\""),
       "exceeds the limit of 4096"},
      {replace("\"ucx_rkey\":\"ab0001\"", "\"ucx_rkey\":\"ab000\""), "hex digits"},
      {replace("\"ucx_rkey\":\"ab0001\"", "\"ucx_rkey\":\"AB0001\""), "lower-case hex"},
      {replace("\"ucx_rkey\":\"ab0001\"", "\"ucx_rkey\":7"), "not a string"},
      {replace("\"worker_address\":\"0100ff7f\"", "\"worker_address\":\"" + big_address + "\""),
       "ucx worker_address of 65537 bytes exceeds"},
      {replace("\"hardware_rma\":true", "\"hardware_rma\":1"), "hardware_rma"},
      {replace("\"hardware_rma\":true", "\"hardware_rma\":true,\"lanes\":2"), "lanes"},
  };
  for (const Case& c : cases) {
    auto parsed = parse_segment_descriptor(c.json);
    ASSERT_FALSE(parsed.ok()) << c.json.substr(0, 300);
    EXPECT_EQ(parsed.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(testing::contains(parsed.status().message(), c.expect))
        << parsed.status().message() << " (expected '" << c.expect << "')";
  }
}

}  // namespace
}  // namespace kvferry
