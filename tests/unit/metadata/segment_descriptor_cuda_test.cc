// The per-region "cuda" object (cuda_ipc): parsed in every build, since a peer built with
// CUDA may advertise it to one built without.
#include <gtest/gtest.h>

#include "metadata/segment_descriptor.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;

CudaIpcBacking sample_backing() {
  CudaIpcBacking b;
  for (size_t i = 0; i < b.handle.size(); ++i) b.handle[i] = static_cast<uint8_t>(i * 37 + 1);
  b.allocation_offset = 0x200;
  b.allocation_bytes = 1 << 20;
  return b;
}

SegmentDescriptor with_device_region() {
  SegmentDescriptor d;
  d.name = "decode-gpu";
  d.endpoint = "127.0.0.1:7000";
  d.incarnation = 7;
  d.host_id = "boot/pid:[1]";
  d.pid = 4242;
  d.transports = TransportSet{TransportKind::kShm, TransportKind::kCudaIpc};
  d.version = 1;
  d.regions.push_back(
      {0x7f00'0000'0200, 4096, {MemoryLocation::Kind::kCuda, 3}, std::nullopt, sample_backing()});
  d.regions.push_back({0x1000, 64, {}, std::nullopt, std::nullopt});
  return d;
}

TEST(SegmentDescriptorCuda, RoundTripsTheDeviceTheHandleAndTheAllocation) {
  auto parsed = parse_segment_descriptor(serialize_segment_descriptor(with_device_region()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_TRUE(parsed->transports.contains(TransportKind::kCudaIpc));
  ASSERT_EQ(parsed->regions.size(), 2u);
  const RegionDescriptor& device = parsed->regions[1];  // sorted by address
  EXPECT_EQ(device.location.kind, MemoryLocation::Kind::kCuda);
  EXPECT_EQ(device.location.device, 3);
  ASSERT_TRUE(device.cuda.has_value());
  EXPECT_EQ(*device.cuda, sample_backing());
  EXPECT_FALSE(parsed->regions[0].cuda.has_value());
}

TEST(SegmentDescriptorCuda, RejectsMalformedCudaObjectsNamingTheProblem) {
  const std::string good = serialize_segment_descriptor(with_device_region());
  const std::string hex = good.substr(good.find("\"ipc_handle\":\"") + 14, 128);
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string json;
    std::string expect;
  };
  std::vector<Case> cases = {
      {replace(hex, hex.substr(0, 126)), "126 hex digits, not 128"},
      {replace(hex, hex + "00"), "130 hex digits"},
      {replace(hex, "zz" + hex.substr(2)), "not lower-case hex"},
      {replace(hex, "AB" + hex.substr(2)), "not lower-case hex"},
      {replace("\"ipc_handle\"", "\"handle\""), "missing field 'ipc_handle'"},
      {replace("\"offset\":512", "\"offset\":-1"), "'offset'"},
      {replace("\"offset\":512", "\"offset\":1048000"), "runs past its allocation"},
      {replace("\"allocation_bytes\":1048576", "\"allocation_bytes\":2048"), "runs past"},
      {replace("\"allocation_bytes\":1048576", "\"allocation_bytes\":18446744073709551615"),
       "exceeds the limit"},
      {replace("\"device\":3", "\"device\":-1"), "has a 'cuda' object but device -1"},
      {replace("\"cuda\":{", "\"cuda\":[{"), "not valid JSON"},
  };
  for (const Case& c : cases) {
    auto parsed = parse_segment_descriptor(c.json);
    ASSERT_FALSE(parsed.ok()) << c.expect;
    EXPECT_EQ(parsed.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(contains(parsed.status().message(), c.expect))
        << "expected '" << c.expect << "' in: " << parsed.status().message();
  }
  std::string array_cuda = good;
  array_cuda.replace(array_cuda.find("\"cuda\":"), 7, "\"cuda\":[1],\"x\":");
  auto parsed = parse_segment_descriptor(array_cuda);
  ASSERT_FALSE(parsed.ok());
  EXPECT_TRUE(contains(parsed.status().message(), "'cuda' is not an object"))
      << parsed.status().message();
}

}  // namespace
}  // namespace kvferry
