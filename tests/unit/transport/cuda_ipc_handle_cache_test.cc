#include <gtest/gtest.h>

#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "transport/cuda_ipc/ipc_handle_cache.h"
#include "unit/transport/fake_cuda_memory_api.h"

namespace kvferry::cuda_ipc {
namespace {

using ::kvferry::testing::FakeCudaMemoryApi;  // not cuda_ipc::testing (GPU tests)

constexpr uint64_t kIncarnationA = 0xa;
constexpr uint64_t kIncarnationB = 0xb;

CudaIpcBacking backing(uint8_t id, uint64_t offset, uint64_t bytes) {
  return CudaIpcBacking{FakeCudaMemoryApi::handle_for(id), offset, bytes};
}

struct CacheFixture : ::testing::Test {
  CacheFixture() {
    api.openable[1] = {0x7000'0000, 1 << 20};
    api.openable[2] = {0x7100'0000, 4 << 20};
  }
  FakeCudaMemoryApi api;
};

TEST_F(CacheFixture, OpensAHandleOnceAndReturnsTheSameMappingAfterwards) {
  IpcHandleCache cache(api);
  auto first = cache.acquire(kIncarnationA, backing(1, 0, 1 << 20), 3);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(reinterpret_cast<uint64_t>((*first)->base()), 0x7000'0000u);
  EXPECT_EQ(api.last_open_device, 3);
  auto again = cache.acquire(kIncarnationA, backing(1, 4096, 1 << 20), 3);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), first->get());
  EXPECT_EQ(api.opens, 1);
  EXPECT_EQ(cache.size(), 1u);
}

TEST_F(CacheFixture, ForgettingAnIncarnationDropsOnlyItsHandlesAndClosesThemWhenUnused) {
  IpcHandleCache cache(api);
  auto held = cache.acquire(kIncarnationA, backing(1, 0, 1 << 20), 0);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(cache.acquire(kIncarnationA, backing(2, 0, 4 << 20), 0).ok());
  ASSERT_TRUE(cache.acquire(kIncarnationB, backing(2, 0, 4 << 20), 0).ok());
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.forget(kIncarnationA), 2u);
  EXPECT_EQ(cache.size(), 1u);
  // A batch still holds handle 1 of incarnation A: closed only when it lets go.
  EXPECT_EQ(api.closes, 1);
  held = Result<std::shared_ptr<const IpcMapping>>(Internal("released"));
  EXPECT_EQ(api.closes, 2);
  // The restarted peer's handle is opened afresh.
  ASSERT_TRUE(cache.acquire(kIncarnationA, backing(1, 0, 1 << 20), 0).ok());
  EXPECT_EQ(api.opens, 4);
}

TEST_F(CacheFixture, AClaimLargerThanTheOpenedAllocationIsAProtocolErrorEvenWhenCached) {
  IpcHandleCache cache(api);
  auto lying = cache.acquire(kIncarnationA, backing(1, 0, 2 << 20), 0);
  ASSERT_FALSE(lying.ok());
  EXPECT_EQ(lying.status().code(), StatusCode::kProtocolError);
  EXPECT_NE(lying.status().message().find("claims an allocation of 2097152 bytes"),
            std::string::npos)
      << lying.status().message();
  ASSERT_TRUE(cache.acquire(kIncarnationA, backing(1, 0, 1 << 20), 0).ok());
  EXPECT_EQ(cache.acquire(kIncarnationA, backing(1, 0, 2 << 20), 0).status().code(),
            StatusCode::kProtocolError);
}

TEST_F(CacheFixture, AnUnopenableHandleIsAnErrorAndCachesNothing) {
  IpcHandleCache cache(api);
  auto r = cache.acquire(kIncarnationA, backing(9, 0, 64), 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("cudaIpcOpenMemHandle"), std::string::npos);
  EXPECT_EQ(cache.size(), 0u);
}

// The peer's regions as attach_segment builds them for cuda_ipc: device regions with no
// pointer here, only their IPC backing.
RegionIndex peer_regions() {
  RegionEntries entries;
  entries.push_back({0x1'0000,
                     0x1000,
                     nullptr,
                     {MemoryLocation::Kind::kCuda, 1},
                     std::nullopt,
                     nullptr,
                     backing(1, 0x100, 1 << 20)});
  entries.push_back({0x2'0000,
                     0x1000,
                     nullptr,
                     {MemoryLocation::Kind::kCuda, 1},
                     std::nullopt,
                     nullptr,
                     backing(1, 0x8000, 1 << 20)});
  entries.push_back({0x3'0000,
                     0x1000,
                     nullptr,
                     {MemoryLocation::Kind::kCuda, 1},
                     std::nullopt,
                     nullptr,
                     backing(2, 0, 4 << 20)});
  return RegionIndex(std::move(entries));
}

TEST_F(CacheFixture, MapsEveryUnmappedSpanToItsAllocationPlusOffsetsAndHoldsEachMappingOnce) {
  IpcHandleCache cache(api);
  RegionIndex remote = peer_regions();
  char local[64];
  std::vector<ResolvedOp> spans = {
      {OpKind::kWrite, local, 0x1'0010, nullptr, 16},
      {OpKind::kWrite, local, 0x2'0020, nullptr, 16},
      {OpKind::kRead, local, 0x3'0ff0, nullptr, 16},
      {OpKind::kWrite, local, 0x1'0000, local + 32, 16}};  // already mapped
  std::vector<std::shared_ptr<const IpcMapping>> keep_alive;
  ASSERT_TRUE(map_remote_device_spans(spans, remote, cache, kIncarnationA, keep_alive).ok());
  EXPECT_EQ(reinterpret_cast<uint64_t>(spans[0].remote), 0x7000'0000u + 0x100 + 0x10);
  EXPECT_EQ(reinterpret_cast<uint64_t>(spans[1].remote), 0x7000'0000u + 0x8000 + 0x20);
  EXPECT_EQ(reinterpret_cast<uint64_t>(spans[2].remote), 0x7100'0000u + 0xff0);
  EXPECT_EQ(spans[3].remote, local + 32);
  EXPECT_EQ(spans[2].dst(), local);  // a READ lands locally
  EXPECT_EQ(keep_alive.size(), 2u);
  EXPECT_EQ(api.opens, 2);
  EXPECT_EQ(api.last_open_device, 1);
}

TEST_F(CacheFixture, BatchDeviceIsTheLocalDeviceElseThePeers) {
  RegionIndex remote = peer_regions();
  std::vector<char> host(64);
  RegionIndex local(RegionEntries{{reinterpret_cast<uint64_t>(host.data()),
                                   64,
                                   host.data(),
                                   {},
                                   std::nullopt,
                                   nullptr,
                                   std::nullopt}});
  std::vector<ResolvedOp> spans = {{OpKind::kWrite, host.data(), 0x1'0010, nullptr, 16}};
  EXPECT_EQ(batch_device(spans, local, remote), 1);  // pinned host -> the peer's cuda:1
  RegionIndex local_device(RegionEntries{{reinterpret_cast<uint64_t>(host.data()),
                                          64,
                                          host.data(),
                                          {MemoryLocation::Kind::kCuda, 2},
                                          std::nullopt,
                                          nullptr,
                                          std::nullopt}});
  EXPECT_EQ(batch_device(spans, local_device, remote), 2);
}

}  // namespace
}  // namespace kvferry::cuda_ipc
