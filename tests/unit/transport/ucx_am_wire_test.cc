// The ucx transport's active-message protocol: its header, which peers get it instead of
// put/get, the deadline conversion, and the target's check of every request (the range
// inside one registered region, the deadline on the target's clock).
#include "transport/ucx/ucx_am_wire.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "transport/batch_progress.h"

namespace kvferry::detail {
namespace {

TEST(UcxAmWire, HeaderRoundTripsEveryField) {
  UcxAmHeader h;
  h.request_id = 0x0123456789abcdefULL;
  h.addr = 0x7f00deadbeef0000ULL;
  h.length = (8ull << 20) + 3;
  h.deadline_ns = -42;
  h.status = static_cast<uint32_t>(StatusCode::kTimeout);
  UcxAmHeaderBytes bytes = encode_ucx_am_header(h);
  Result<UcxAmHeader> back = decode_ucx_am_header(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->request_id, h.request_id);
  EXPECT_EQ(back->addr, h.addr);
  EXPECT_EQ(back->length, h.length);
  EXPECT_EQ(back->deadline_ns, h.deadline_ns);
  EXPECT_EQ(back->status, h.status);
}

TEST(UcxAmWire, HeaderOfTheWrongSizeOrWithAnUnknownStatusIsAProtocolErrorNamingIt) {
  UcxAmHeaderBytes bytes = encode_ucx_am_header({});
  Result<UcxAmHeader> short_one = decode_ucx_am_header(bytes.data(), bytes.size() - 1);
  ASSERT_FALSE(short_one.ok());
  EXPECT_EQ(short_one.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(short_one.status().message().find("39 bytes"), std::string::npos)
      << short_one.status().message();
  EXPECT_EQ(decode_ucx_am_header(nullptr, 0).status().code(), StatusCode::kProtocolError);
  UcxAmHeader bad;
  bad.status = 200;
  bytes = encode_ucx_am_header(bad);
  Result<UcxAmHeader> unknown = decode_ucx_am_header(bytes.data(), bytes.size());
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("200"), std::string::npos);
}

TEST(UcxAmWire, PutGetOnlyWithHardwareRmaOnBothSidesElseActiveMessages) {
  EXPECT_EQ(choose_ucx_data_path(true, true), UcxDataPath::kRma);
  EXPECT_EQ(choose_ucx_data_path(true, false), UcxDataPath::kActiveMessages);
  EXPECT_EQ(choose_ucx_data_path(false, true), UcxDataPath::kActiveMessages);
  EXPECT_EQ(choose_ucx_data_path(false, false), UcxDataPath::kActiveMessages);
}

TEST(UcxAmWire, DeadlinesConvertByTheOffsetAndSaturate) {
  const Clock::time_point t = Clock::now();
  EXPECT_EQ(ucx_target_deadline_ns(t, 1000), ucx_clock_ns(t) + 1000);
  EXPECT_EQ(ucx_target_deadline_ns(t, -1000), ucx_clock_ns(t) - 1000);
  EXPECT_EQ(ucx_target_deadline_ns(Clock::time_point::max(), -5),
            std::numeric_limits<int64_t>::max());
  const Clock::time_point late = Clock::time_point::max() - std::chrono::nanoseconds(10);
  EXPECT_EQ(ucx_target_deadline_ns(late, 100), std::numeric_limits<int64_t>::max());
  // The target read its clock (2000) before we received the reply (our 1500): offset 500,
  // never more, so a converted deadline is at most early by the reply's transit.
  EXPECT_EQ(ucx_clock_offset_ns(2000, 1500), 500);
}

TEST(UcxAmWire, ReplyStatusCarriesTheCodeAndNamesThePeer) {
  EXPECT_TRUE(ucx_am_reply_status(0, "peer-a", "write").ok());
  Status s =
      ucx_am_reply_status(static_cast<uint32_t>(StatusCode::kNotRegistered), "peer-a", "write");
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered);
  EXPECT_NE(s.message().find("peer-a"), std::string::npos) << s.message();
}

class UcxAmTargetCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    host_.resize(kBytes);
    RegionEntry host;
    host.addr = kHostAddr;
    host.length = kBytes;
    host.host_ptr = reinterpret_cast<char*>(host_.data());
    host.use = host_use_;
    RegionEntry device;
    device.addr = kDeviceAddr;
    device.length = kBytes;
    device.host_ptr = reinterpret_cast<char*>(0x1000);
    device.location = MemoryLocation{MemoryLocation::Kind::kCuda, 0};
    device.use = std::make_shared<RegionUse>();
    regions_ = std::make_shared<const RegionIndex>(RegionEntries{host, device});
  }
  static constexpr uint64_t kHostAddr = 0x10000;
  static constexpr uint64_t kDeviceAddr = 0x100000;
  static constexpr uint64_t kBytes = 4096;
  static constexpr int64_t kNow = 1'000'000;
  std::vector<std::byte> host_;
  std::shared_ptr<RegionUse> host_use_ = std::make_shared<RegionUse>();
  std::shared_ptr<const RegionIndex> regions_;
};

TEST_F(UcxAmTargetCheck, RangeInsideARegionIsPinnedUntilReleased) {
  Result<UcxAmPin> pin = check_ucx_am_target(regions_, kHostAddr + 100, 200, kNow + 1, kNow, 0);
  ASSERT_TRUE(pin.ok()) << pin.status().to_string();
  EXPECT_EQ(pin->ptr, reinterpret_cast<char*>(host_.data()) + 100);
  EXPECT_EQ(host_use_->in_flight.load(), 1);
  UcxAmPin moved = std::move(pin).value();
  EXPECT_EQ(host_use_->in_flight.load(), 1);
  moved.release();
  EXPECT_EQ(host_use_->in_flight.load(), 0);
  // The whole region, and a deadline exactly now, still pass.
  EXPECT_TRUE(check_ucx_am_target(regions_, kHostAddr, kBytes, kNow, kNow, 0).ok());
  EXPECT_EQ(host_use_->in_flight.load(), 0);
}

TEST_F(UcxAmTargetCheck, RangesOutsideOrStraddlingARegionAreNotRegisteredNamingTheRange) {
  struct Case {
    uint64_t addr, length;
  };
  for (Case c :
       {Case{kHostAddr + kBytes, 1}, Case{kHostAddr + kBytes - 8, 16}, Case{kHostAddr - 1, 2},
        Case{0, 16}, Case{kHostAddr, std::numeric_limits<uint64_t>::max()}}) {
    Result<UcxAmPin> pin = check_ucx_am_target(regions_, c.addr, c.length, kNow + 1, kNow, 0);
    ASSERT_FALSE(pin.ok()) << c.addr;
    EXPECT_EQ(pin.status().code(), StatusCode::kNotRegistered);
    EXPECT_NE(pin.status().message().find(fmt::format("{:#x}", c.addr)), std::string::npos)
        << pin.status().message();
  }
  EXPECT_EQ(host_use_->in_flight.load(), 0);
  EXPECT_EQ(check_ucx_am_target(nullptr, kHostAddr, 1, kNow + 1, kNow, 0).status().code(),
            StatusCode::kNotRegistered);
}

TEST_F(UcxAmTargetCheck, PastTheDeadlineOnTheTargetsClockIsATimeoutAndPinsNothing) {
  Result<UcxAmPin> pin = check_ucx_am_target(regions_, kHostAddr, 16, kNow - 1, kNow, 0);
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), StatusCode::kTimeout);
  EXPECT_EQ(host_use_->in_flight.load(), 0);
}

TEST_F(UcxAmTargetCheck, AWriteWithinTheLandingMarginOfItsDeadlineIsATimeoutAndPinsNothing) {
  Result<UcxAmPin> pin = check_ucx_am_target(regions_, kHostAddr, 16, kNow + kLandingMarginNs - 1,
                                             kNow, kLandingMarginNs);
  ASSERT_FALSE(pin.ok());
  EXPECT_EQ(pin.status().code(), StatusCode::kTimeout);
  EXPECT_NE(pin.status().message().find("before its deadline"), std::string::npos)
      << pin.status().message();
  EXPECT_EQ(host_use_->in_flight.load(), 0);
  // The margin exactly: it may land.
  EXPECT_TRUE(
      check_ucx_am_target(regions_, kHostAddr, 16, kNow + kLandingMarginNs, kNow, kLandingMarginNs)
          .ok());
  EXPECT_EQ(host_use_->in_flight.load(), 0);
}

TEST_F(UcxAmTargetCheck, DeviceMemoryAndARegionBeingUnregisteredAreRefused) {
  EXPECT_EQ(check_ucx_am_target(regions_, kDeviceAddr, 16, kNow + 1, kNow, 0).status().code(),
            StatusCode::kNotSupported);
  host_use_->removed.store(true);
  EXPECT_EQ(check_ucx_am_target(regions_, kHostAddr, 16, kNow + 1, kNow, 0).status().code(),
            StatusCode::kNotRegistered);
  EXPECT_EQ(host_use_->in_flight.load(), 0);
}

}  // namespace
}  // namespace kvferry::detail
