#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "mapped_pages.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::make_engine;
using testing::must;

TEST(Registration, RejectsZeroLengthAndNullNamingTheRegion) {
  auto engine = make_engine("reg");
  std::vector<char> buf(4096);
  Status zero = engine->register_memory(buf.data(), 0);
  EXPECT_EQ(zero.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(zero.message(), "length 0")) << zero.message();
  EXPECT_EQ(engine->register_memory(nullptr, 16).code(), StatusCode::kInvalidArgument);
}

TEST(Registration, RejectsOverlapNamingBothRanges) {
  auto engine = make_engine("reg");
  std::vector<char> buf(8192);
  ASSERT_TRUE(engine->register_memory(buf.data(), 4096).ok());
  Status overlap = engine->register_memory(buf.data() + 4000, 1000);
  EXPECT_EQ(overlap.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(contains(overlap.message(),
                       fmt::format("{:#x}", reinterpret_cast<uint64_t>(buf.data() + 4000))))
      << overlap.message();
  // Adjacent is fine.
  EXPECT_TRUE(engine->register_memory(buf.data() + 4096, 4096).ok());
}

TEST(Registration, BatchFormIsAllOrNothing) {
  auto engine = make_engine("reg");
  std::vector<char> buf(8192);
  MemoryRegion regions[] = {{buf.data(), 4096, {}}, {buf.data() + 100, 10, {}}};
  EXPECT_EQ(engine->register_memory(regions).code(), StatusCode::kAlreadyExists);
  // Nothing of the failed batch was registered: the first region registers now.
  EXPECT_TRUE(engine->register_memory(buf.data(), 4096).ok());
}

TEST(Registration, UnregisterUnknownAddressNamesIt) {
  auto engine = make_engine("reg");
  std::vector<char> buf(64);
  Status s = engine->unregister_memory(buf.data());
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(contains(s.message(), fmt::format("{:#x}", reinterpret_cast<uint64_t>(buf.data()))));
}

TEST(Registration, UnregisterWhileABatchUsesTheRegionIsRefused) {
  auto engine = make_engine("reg", 1);
  const size_t bytes = 256u << 20;  // large enough to still be copying when we unregister
  std::vector<char> src(bytes, 1);
  std::vector<char> dst(bytes, 0);
  ASSERT_TRUE(engine->register_memory(src.data(), bytes).ok());
  ASSERT_TRUE(engine->register_memory(dst.data(), bytes).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.data()), bytes};
  BatchHandle batch = must(engine->submit(self, {&op, 1}));
  Status busy = engine->unregister_memory(dst.data());
  BatchStatus done = engine->wait(batch, std::chrono::seconds(30));
  ASSERT_EQ(done.state, BatchState::kCompleted) << done.status.to_string();
  if (busy.ok()) GTEST_SKIP() << "the copy finished before unregister ran; nothing to check";
  EXPECT_EQ(busy.code(), StatusCode::kFailedPrecondition) << busy.to_string();
  EXPECT_TRUE(contains(busy.message(), "in flight"));
  EXPECT_EQ(dst[bytes - 1], 1);
  EXPECT_TRUE(engine->unregister_memory(dst.data()).ok());
}

TEST(Registration, SharedAllocationIsRegisteredAndFreed) {
  auto engine = make_engine("reg");
  SharedBuffer shared = must(engine->allocate_shared(10000));
  EXPECT_GE(shared.length, 10000u);
  EXPECT_EQ(engine->register_memory(shared.addr, 16).code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(engine->free_shared(shared.addr).ok());
  EXPECT_EQ(engine->free_shared(shared.addr).code(), StatusCode::kNotRegistered);
  EXPECT_EQ(engine->allocate_shared(0).status().code(), StatusCode::kInvalidArgument);
}

const size_t kPage = testing::kPageBytes;
using Pages = testing::MappedPages;

// Anonymous pages a test may unmap or protect.

TEST(Registration, UnmappedMemoryIsRefusedNamingTheRangeNotAcceptedToCrashLater) {
  auto engine = make_engine("reg");
  Status s = engine->register_memory(reinterpret_cast<void*>(0x1000), 4096);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "[0x1000, +4096)")) << s.message();
  EXPECT_TRUE(contains(s.message(), "not mapped in this process")) << s.message();
}

TEST(Registration, ARangeRunningPastItsMappingIsRefused) {
  auto engine = make_engine("reg");
  Pages pages(2);
  pages.unmap(1);
  Status s = engine->register_memory(pages.page(0), 2 * kPage);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), fmt::format("{:#x}", reinterpret_cast<uint64_t>(pages.base))))
      << s.message();
  EXPECT_TRUE(engine->register_memory(pages.page(0), kPage).ok());
}

TEST(Registration, UnreadableMemoryIsRefusedAndReadOnlyMemoryAccepted) {
  auto engine = make_engine("reg");
  Pages pages(2);
  ASSERT_EQ(::mprotect(pages.page(0), kPage, PROT_NONE), 0);
  ASSERT_EQ(::mprotect(pages.page(1), kPage, PROT_READ), 0);
  EXPECT_EQ(engine->register_memory(pages.page(0), kPage).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine->register_memory(pages.page(1), kPage).ok());  // a source may be read-only
}

TEST(Registration, ABatchWithOneUnmappedRegionRegistersNothingAndNamesIt) {
  auto engine = make_engine("reg");
  std::vector<char> buf(8192);
  MemoryRegion regions[] = {{buf.data(), 4096, {}}, {reinterpret_cast<void*>(0x2000), 64, {}}};
  Status s = engine->register_memory(regions);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(s.message(), "region 1 [0x2000, +64)")) << s.message();
  EXPECT_EQ(engine->registered_location(buf.data(), 1).status().code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(engine->register_memory(buf.data(), 4096).ok());
}

// `buf` cut into regions of `bytes` each, in address order.
std::vector<MemoryRegion> carve(std::vector<char>& buf, size_t bytes) {
  std::vector<MemoryRegion> regions;
  for (size_t at = 0; at + bytes <= buf.size(); at += bytes) {
    regions.push_back({buf.data() + at, bytes, {}});
  }
  return regions;
}

TEST(Registration, TenThousandRegionsRegisterInOneCall) {
  auto engine = make_engine("reg");
  constexpr size_t kRegions = 10'000, kBytes = 64;
  std::vector<char> buf(kRegions * kBytes);
  std::vector<MemoryRegion> regions = carve(buf, kBytes);
  ASSERT_TRUE(engine->register_memory(regions).ok());
  EXPECT_TRUE(engine->registered_location(buf.data() + 9'999 * kBytes, kBytes).ok());
}

uint64_t address_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// What an engine registers, its peers must accept: past 65,536 regions (a region per block in
// some stacks) a peer opens it and writes into its last region; past what a descriptor carries,
// registering is refused up front, naming the counts, and nothing is registered.
TEST(Registration, APeerAcceptsTheDescriptorOfEveryRegistrationTheEngineAccepts) {
  auto target = make_engine("many-regions");
  constexpr size_t kRegions = 70'000, kBytes = 64;
  std::vector<char> buf(kRegions * kBytes);
  std::vector<MemoryRegion> regions = carve(buf, kBytes);
  ASSERT_TRUE(target->register_memory(regions).ok());

  auto writer = make_engine("writer");
  std::vector<char> src(kBytes, 'k');
  ASSERT_TRUE(writer->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(writer->open_peer(target->endpoint()));
  TransferOp op{OpKind::kWrite, address_of(src.data()),
                address_of(buf.data() + (kRegions - 1) * kBytes), kBytes};
  ASSERT_TRUE(writer->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_EQ(std::string(buf.end() - kBytes, buf.end()), std::string(kBytes, 'k'));

  std::vector<char> more((kMaxDescriptorRegions - kRegions + 1) * kBytes);
  const std::vector<MemoryRegion> too_many = carve(more, kBytes);
  Status refused = target->register_memory(too_many);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.message(), fmt::format("registering {} regions beside the {} "
                                                      "registered",
                                                      too_many.size(), kRegions)))
      << refused.message();
  EXPECT_TRUE(contains(refused.message(), std::to_string(kMaxDescriptorRegions)))
      << refused.message();
  EXPECT_EQ(target->registered_location(more.data(), kBytes).status().code(),
            StatusCode::kNotRegistered);
}

TEST(Registration, ABatchOverlappingItselfIsRefusedNamingBothAndRegistersNothing) {
  auto engine = make_engine("reg");
  std::vector<char> buf(16 * 256);
  std::vector<MemoryRegion> regions;
  for (size_t i = 0; i < 7; ++i) regions.push_back({buf.data() + (i + 1) * 256, 256, {}});
  regions[5] = {buf.data() + 256 + 100, 50, {}};  // inside region 0, not its neighbour
  Status s = engine->register_memory(regions);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.to_string();
  EXPECT_TRUE(
      contains(s.message(), fmt::format("region 5 [{:#x}, +50)", address_of(regions[5].addr))))
      << s.message();
  EXPECT_TRUE(
      contains(s.message(), fmt::format("region 0 [{:#x}, +256)", address_of(regions[0].addr))))
      << s.message();
  for (const MemoryRegion& r : regions) {
    EXPECT_EQ(engine->registered_location(r.addr, r.length).status().code(),
              StatusCode::kNotRegistered);
  }
  regions.erase(regions.begin() + 5);
  EXPECT_TRUE(engine->register_memory(regions).ok());
}

TEST(Registration, ABatchOverlappingARegisteredRegionIsRefusedAndTheRegisteredOneSurvives) {
  auto engine = make_engine("reg");
  std::vector<char> buf(4 * 4096);
  ASSERT_TRUE(engine->register_memory(buf.data(), 4096).ok());
  MemoryRegion regions[] = {{buf.data() + 8192, 4096, {}}, {buf.data() + 4000, 200, {}}};
  Status s = engine->register_memory(regions);
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists) << s.to_string();
  EXPECT_TRUE(
      contains(s.message(), fmt::format("region 1 [{:#x}, +200)", address_of(buf.data() + 4000))))
      << s.message();
  EXPECT_TRUE(contains(s.message(), fmt::format("[{:#x}, +4096)", address_of(buf.data()))))
      << s.message();
  EXPECT_TRUE(engine->registered_location(buf.data(), 4096).ok());
  EXPECT_EQ(engine->registered_location(buf.data() + 8192, 1).status().code(),
            StatusCode::kNotRegistered);
  EXPECT_TRUE(engine->unregister_memory(buf.data()).ok());
}

TEST(Registration, TouchingRangesAreAcceptedInAnyOrder) {
  auto engine = make_engine("reg");
  std::vector<char> buf(4 * 4096);
  ASSERT_TRUE(engine->register_memory(buf.data() + 2 * 4096, 4096).ok());
  // Given in descending order; the first ends where the registered one starts.
  MemoryRegion regions[] = {
      {buf.data() + 4096, 4096, {}}, {buf.data(), 4096, {}}, {buf.data() + 3 * 4096, 4096, {}}};
  ASSERT_TRUE(engine->register_memory(regions).ok());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(engine->registered_location(buf.data() + i * 4096, 4096).ok()) << i;
  }
  EXPECT_EQ(engine->registered_location(buf.data() + 4000, 200).status().code(),
            StatusCode::kNotRegistered);  // across two regions
}

TEST(Registration, TwentyThousandShuffledRegionsRegisterAndUnregisterInOneCallEach) {
  auto engine = make_engine("reg");
  constexpr size_t kRegions = 20'000, kBytes = 64;
  std::vector<char> buf(kRegions * kBytes);
  std::vector<MemoryRegion> regions = carve(buf, kBytes);
  std::mt19937_64 rng(11);
  std::shuffle(regions.begin(), regions.end(), rng);
  ASSERT_TRUE(engine->register_memory(regions).ok());
  for (size_t i = 0; i < kRegions; ++i) {
    ASSERT_TRUE(engine->registered_location(buf.data() + i * kBytes, kBytes).ok()) << i;
  }
  std::vector<void*> addrs;
  for (const MemoryRegion& r : regions) addrs.push_back(r.addr);
  std::shuffle(addrs.begin(), addrs.end(), rng);
  ASSERT_TRUE(engine->unregister_memory(addrs).ok());
  for (size_t i = 0; i < kRegions; ++i) {
    ASSERT_EQ(engine->registered_location(buf.data() + i * kBytes, 1).status().code(),
              StatusCode::kNotRegistered)
        << i;
  }
  // The whole buffer is free again: one region covering it registers.
  EXPECT_TRUE(engine->register_memory(buf.data(), buf.size()).ok());
}

TEST(Registration, UnregisterWithAnUnknownAddressInTheBatchChangesNothing) {
  auto engine = make_engine("reg");
  std::vector<char> buf(5 * 256);
  std::vector<MemoryRegion> regions;
  for (size_t i = 0; i < 5; ++i) regions.push_back({buf.data() + i * 256, 256, {}});
  ASSERT_TRUE(engine->register_memory(regions).ok());
  // A vector, not an array: an array would decay to the single-address overload.
  std::vector<void*> addrs = {buf.data(), buf.data() + 256, buf.data() + 300, buf.data() + 768};
  Status s = engine->unregister_memory(addrs);
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  EXPECT_TRUE(contains(s.message(), fmt::format("{:#x}", address_of(buf.data() + 300))))
      << s.message();
  for (const MemoryRegion& r : regions) EXPECT_TRUE(engine->registered_location(r.addr, 256).ok());
  std::vector<void*> all;
  for (const MemoryRegion& r : regions) all.push_back(r.addr);
  EXPECT_TRUE(engine->unregister_memory(all).ok());
}

TEST(Registration, AnAddressGivenTwiceToUnregisterRemovesItsRegionOnce) {
  auto engine = make_engine("reg");
  std::vector<char> buf(3 * 256);
  MemoryRegion regions[] = {
      {buf.data(), 256, {}}, {buf.data() + 256, 256, {}}, {buf.data() + 512, 256, {}}};
  ASSERT_TRUE(engine->register_memory(regions).ok());
  std::vector<void*> addrs = {buf.data(), buf.data() + 256, buf.data()};
  ASSERT_TRUE(engine->unregister_memory(addrs).ok());
  EXPECT_EQ(engine->registered_location(buf.data(), 1).status().code(), StatusCode::kNotRegistered);
  EXPECT_EQ(engine->registered_location(buf.data() + 256, 1).status().code(),
            StatusCode::kNotRegistered);
  EXPECT_TRUE(engine->registered_location(buf.data() + 512, 256).ok());  // not given: stays
  EXPECT_TRUE(engine->register_memory(buf.data(), 512).ok());
}

TEST(Registration, RegisteredLocationAnswersOnlyForRangesInsideOneRegion) {
  auto engine = make_engine("reg");
  std::vector<char> buf(8192);
  ASSERT_TRUE(engine->register_memory(buf.data(), 4096).ok());
  ASSERT_TRUE(engine->register_memory(buf.data() + 4096, 4096).ok());
  Result<MemoryLocation> inside = engine->registered_location(buf.data() + 100, 3996);
  ASSERT_TRUE(inside.ok()) << inside.status().to_string();
  EXPECT_EQ(inside->kind, MemoryLocation::Kind::kHost);
  // Across two regions, past the end, and far away.
  Result<MemoryLocation> across = engine->registered_location(buf.data() + 4000, 200);
  EXPECT_EQ(across.status().code(), StatusCode::kNotRegistered);
  EXPECT_TRUE(contains(across.status().message(),
                       fmt::format("{:#x}", reinterpret_cast<uint64_t>(buf.data() + 4000))));
  EXPECT_EQ(engine->registered_location(buf.data() + 8000, 193).status().code(),
            StatusCode::kNotRegistered);
  EXPECT_EQ(engine->registered_location(reinterpret_cast<void*>(0x1000), 1).status().code(),
            StatusCode::kNotRegistered);
}

TEST(EngineOptions, BadValuesAreErrorsNamingThem) {
  EngineOptions o;
  o.metadata_uri = "zookeeper://x";
  auto e = TransferEngine::create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_TRUE(contains(e.status().message(), "zookeeper://x"));
  o = EngineOptions{};
  o.listen_address = "127.0.0.1:http";
  e = TransferEngine::create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(e.status().message(), "127.0.0.1:http"));
  o = EngineOptions{};
  o.allowed_transports = TransportSet{TransportKind::kRdma};
  EXPECT_EQ(TransferEngine::create(o).status().code(), StatusCode::kNotSupported);
}

}  // namespace
}  // namespace kvferry
