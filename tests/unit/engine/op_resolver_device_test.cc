// resolve_ops with device memory: which transport may touch what. No GPU is needed: the
// resolver only reads locations and pointers, it never dereferences them.
#include <gtest/gtest.h>

#include "engine/op_resolver.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;

constexpr uint64_t kHostLocal = 0x10'0000;
constexpr uint64_t kDeviceLocal = 0x20'0000;
constexpr uint64_t kPeerDevice = 0x90'0000;
constexpr uint64_t kPeerHostMapped = 0xa0'0000;
constexpr uint64_t kPeerHostUnmapped = 0xb0'0000;
constexpr uint64_t kBytes = 0x1'0000;

char* fake_ptr(uint64_t addr) { return reinterpret_cast<char*>(addr); }
MemoryLocation cuda(int device) { return {MemoryLocation::Kind::kCuda, device}; }

RegionIndex local_regions() {
  return RegionIndex({{kHostLocal,
                       kBytes,
                       fake_ptr(kHostLocal),
                       {},
                       std::nullopt,
                       std::make_shared<RegionUse>(),
                       std::nullopt},
                      {kDeviceLocal, kBytes, fake_ptr(kDeviceLocal), cuda(0), std::nullopt,
                       std::make_shared<RegionUse>(), std::nullopt}});
}

RegionIndex peer_regions() {
  return RegionIndex(
      {{kPeerDevice, kBytes, nullptr, cuda(1), std::nullopt, nullptr,
        CudaIpcBacking{{}, 0, kBytes}},
       {kPeerHostMapped, kBytes, fake_ptr(0x5000'0000), {}, std::nullopt, nullptr, std::nullopt},
       {kPeerHostUnmapped, kBytes, nullptr, {}, std::nullopt, nullptr, std::nullopt}});
}

ResolvedOps resolve(std::vector<TransferOp> ops, CopyAccess access) {
  static const RegionIndex local = local_regions();
  static const RegionIndex remote = peer_regions();
  return resolve_ops(ops, local, remote, "peer-x", true, access);
}

TEST(DeviceOpValidation, DeviceCopiesReachPeerDeviceMemoryByAddressAndMarkTheBatch) {
  ResolvedOps out = resolve({{OpKind::kWrite, kHostLocal, kPeerDevice, 64},
                             {OpKind::kWrite, kHostLocal + 64, kPeerDevice + 64, 64},
                             {OpKind::kRead, kDeviceLocal, kPeerDevice + 4096, 128}},
                            CopyAccess::kDevicePointers);
  ASSERT_TRUE(out.status.ok()) << out.status.to_string();
  EXPECT_TRUE(out.batch.parts.front().touches_device);
  ASSERT_EQ(out.batch.parts.front().spans.size(), 2u);  // the first two merged
  EXPECT_EQ(out.batch.parts.front().spans[0].length, 128u);
  EXPECT_EQ(out.batch.parts.front().spans[0].remote,
            nullptr);  // mapped later through the IPC handle
  EXPECT_EQ(out.batch.parts.front().spans[1].dst(), fake_ptr(kDeviceLocal));
}

TEST(DeviceOpValidation, DeviceCopiesBetweenHostRegionsDoNotTouchTheDevice) {
  ResolvedOps out =
      resolve({{OpKind::kWrite, kHostLocal, kPeerHostMapped, 64}}, CopyAccess::kDevicePointers);
  ASSERT_TRUE(out.status.ok());
  EXPECT_FALSE(out.batch.parts.front().touches_device);
}

TEST(DeviceOpValidation, HostMemcpyRefusesDeviceMemoryOnEitherSideNamingOpAndRegion) {
  ResolvedOps remote = resolve({{OpKind::kWrite, kHostLocal, kPeerHostMapped, 64},
                                {OpKind::kWrite, kHostLocal, kPeerDevice, 64}},
                               CopyAccess::kHostPointers);
  EXPECT_EQ(remote.status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(remote.status.message(), "op 1: remote region at 0x900000 is cuda:1 memory"))
      << remote.status.message();
  EXPECT_TRUE(contains(remote.status.message(), "cuda_ipc"));
  ResolvedOps local =
      resolve({{OpKind::kWrite, kDeviceLocal, kPeerHostMapped, 64}}, CopyAccess::kHostPointers);
  EXPECT_EQ(local.status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(local.status.message(), "op 0: local region at 0x200000 is cuda:0 memory"))
      << local.status.message();
}

TEST(DeviceOpValidation, TcpRefusesDeviceMemory) {
  ResolvedOps out =
      resolve({{OpKind::kRead, kDeviceLocal, kPeerHostUnmapped, 64}}, CopyAccess::kRemoteAddress);
  EXPECT_EQ(out.status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(out.status.message(), "a tcp copy cannot touch")) << out.status.message();
  EXPECT_TRUE(
      resolve({{OpKind::kRead, kHostLocal, kPeerHostUnmapped, 64}}, CopyAccess::kRemoteAddress)
          .status.ok());
}

TEST(DeviceOpValidation, DeviceCopiesStillNeedPeerHostMemoryToBeMapped) {
  ResolvedOps out =
      resolve({{OpKind::kWrite, kDeviceLocal, kPeerHostUnmapped, 64}}, CopyAccess::kDevicePointers);
  EXPECT_EQ(out.status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(out.status.message(), "not shareable")) << out.status.message();
}

TEST(DeviceOpValidation, PeerDeviceMemoryWithoutAnIpcHandleIsRefused) {
  const RegionIndex local = local_regions();
  const RegionIndex remote(
      {{kPeerDevice, kBytes, nullptr, cuda(1), std::nullopt, nullptr, std::nullopt}});
  ResolvedOps out =
      resolve_ops(std::vector<TransferOp>{{OpKind::kWrite, kHostLocal, kPeerDevice, 64}}, local,
                  remote, "peer-x", true, CopyAccess::kDevicePointers);
  EXPECT_EQ(out.status.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(out.status.message(), "without an IPC handle")) << out.status.message();
}

}  // namespace
}  // namespace kvferry
