#include <gtest/gtest.h>

#include "transport/cuda_ipc/cuda_region_export.h"
#include "unit/transport/fake_cuda_memory_api.h"

namespace kvferry::cuda_ipc {
namespace {

using ::kvferry::testing::FakeCudaMemoryApi;  // not cuda_ipc::testing (GPU tests)

constexpr uint64_t kBase = 0x3'0000'0000;  // handle id (base >> 20) & 0xff == 0

void* at(uint64_t addr) { return reinterpret_cast<void*>(addr); }
MemoryLocation cuda(int device) { return {MemoryLocation::Kind::kCuda, device}; }

struct ExportFixture : ::testing::Test {
  ExportFixture() {
    api.allocations[kBase] = {1 << 20, PointerKind::kDevice, 1};
    api.allocations[kBase + (64 << 20)] = {4096, PointerKind::kPinnedHost, 0};
  }
  FakeCudaMemoryApi api;
};

TEST_F(ExportFixture, ARegionInsideAnAllocationExportsTheAllocationsHandleAndItsOffset) {
  auto r = export_cuda_region(api, at(kBase + 4096), 8192, cuda(1));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->handle, api.handle_for(0));
  EXPECT_EQ(r->allocation_offset, 4096u);
  EXPECT_EQ(r->allocation_bytes, 1u << 20);
}

TEST_F(ExportFixture, MemoryOfAnotherDeviceIsRefusedNamingBoth) {
  auto r = export_cuda_region(api, at(kBase), 64, cuda(0));
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("registered as cuda:0 is memory of cuda:1"),
            std::string::npos)
      << r.status().message();
}

TEST_F(ExportFixture, HostMemoryRegisteredAsCudaIsRefusedSayingWhatItIs) {
  auto pinned = export_cuda_region(api, at(kBase + (64 << 20)), 64, cuda(0));
  ASSERT_EQ(pinned.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pinned.status().message().find("pinned host memory; register pinned host memory with "
                                           "location host"),
            std::string::npos)
      << pinned.status().message();
  int on_stack = 0;
  auto pageable = export_cuda_region(api, &on_stack, sizeof(on_stack), cuda(0));
  ASSERT_EQ(pageable.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(pageable.status().message().find("pageable host memory"), std::string::npos);
}

TEST_F(ExportFixture, ARegionRunningPastItsAllocationIsRefused) {
  auto r = export_cuda_region(api, at(kBase + (1 << 20) - 64), 128, cuda(1));
  ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("runs past its CUDA allocation"), std::string::npos);
}

TEST_F(ExportFixture, AHostLocationIsNotExported) {
  auto r = export_cuda_region(api, at(kBase), 64, MemoryLocation{});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvferry::cuda_ipc
