// tcp with real device memory, between two processes on one GPU over loopback: device ->
// device staged through pinned buffers on both sides, WRITEs (every byte verified by the
// peer) and READs (every byte verified here); and the benchmark tcp-with-device-memory /
// tcp-with-host-memory, WRITE and READ, in the same run (only with
// KVFERRY_TCP_DEVICE_BENCH=1; scripts/gpu-check.sh sets it and checks the ratio). Skips
// where no CUDA device is usable. Built only with CUDA (the name ends in _cuda_test).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include "unit/transport/cuda_ipc_gpu_support.h"

namespace kvferry::cuda_ipc::testing {
namespace {

using kvferry::testing::make_engine;
using kvferry::testing::must;
using kvferry::testing::open_tcp;
using Seconds = std::chrono::duration<double>;

constexpr MemoryLocation kCuda0{MemoryLocation::Kind::kCuda, 0};

TEST(TcpDeviceGpu, DeviceToDeviceAcrossTwoProcessesArrivesIntact) {
  KVF_SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 64u << 20;
  GpuPeer peer = must(start_gpu_peer(kBytes));
  auto engine = make_engine("tcp-device");
  CudaBuffer src = CudaBuffer::device(kBytes);
  src.fill(41, 0, kBytes);
  ASSERT_TRUE(engine->register_memory(src.get(), kBytes, kCuda0).ok());
  PeerHandle p = open_tcp(*engine, peer.endpoint);
  // One 64 MiB op (16 staged chunks over two lanes).
  TransferOp whole{OpKind::kWrite, src.addr(), peer.addr, kBytes};
  Status s = engine->transfer_sync(p, {&whole, 1});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer.ask(fmt::format("verify 41 0 {}", kBytes)), "ok");
  // 16,384 ops of 4 KiB in shuffled order (none merges), with a new pattern.
  src.fill(43, 0, kBytes);
  constexpr uint64_t kOpBytes = 4096;
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kBytes; off += kOpBytes) {
    ops.push_back({OpKind::kWrite, src.addr() + off, peer.addr + off, kOpBytes});
  }
  std::shuffle(ops.begin(), ops.end(), std::mt19937_64(9));
  s = engine->transfer_sync(p, ops);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(peer.ask(fmt::format("verify 43 0 {}", kBytes)), "ok");
}

TEST(TcpDeviceGpu, DeviceReadAcrossTwoProcessesArrivesIntact) {
  KVF_SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 64u << 20;
  GpuPeer peer = must(start_gpu_peer(kBytes));
  ASSERT_EQ(peer.ask(fmt::format("fill 61 0 {}", kBytes)), "ok");
  auto engine = make_engine("tcp-device-read");
  CudaBuffer dst = CudaBuffer::device(kBytes);
  ASSERT_TRUE(engine->register_memory(dst.get(), kBytes, kCuda0).ok());
  std::vector<std::byte> host_dst(kBytes, std::byte{0});
  ASSERT_TRUE(engine->register_memory(host_dst.data(), kBytes).ok());
  PeerHandle p = open_tcp(*engine, peer.endpoint);
  // One 64 MiB READ, the peer's device memory into ours (staged on both sides).
  TransferOp whole{OpKind::kRead, dst.addr(), peer.addr, kBytes};
  Status s = engine->transfer_sync(p, {&whole, 1});
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(dst.mismatch(61, 0, kBytes), -1);
  // The peer's device memory into host memory here, 16,384 shuffled READs of 4 KiB.
  ASSERT_EQ(peer.ask(fmt::format("fill 63 0 {}", kBytes)), "ok");
  constexpr uint64_t kOpBytes = 4096;
  std::vector<TransferOp> ops;
  for (uint64_t off = 0; off < kBytes; off += kOpBytes) {
    ops.push_back({OpKind::kRead, reinterpret_cast<uint64_t>(host_dst.data()) + off,
                   peer.addr + off, kOpBytes});
  }
  std::shuffle(ops.begin(), ops.end(), std::mt19937_64(11));
  s = engine->transfer_sync(p, ops);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_FALSE(find_pattern_mismatch(host_dst, 63));
}

TEST(TcpDeviceBench, DeviceMemoryAgainstHostMemoryInTheSameRun) {
  if (std::getenv("KVFERRY_TCP_DEVICE_BENCH") == nullptr) {
    GTEST_SKIP() << "benchmark: runs with KVFERRY_TCP_DEVICE_BENCH=1 (scripts/gpu-check.sh)";
  }
  KVF_SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 256u << 20;
  constexpr int kRounds = 8;
  GpuPeer peer = must(start_gpu_peer(kBytes, /*with_host=*/true));
  ASSERT_NE(peer.host_addr, 0u);
  auto engine = make_engine("tcp-device-bench");
  CudaBuffer device_src = CudaBuffer::device(kBytes);
  device_src.fill(51, 0, kBytes);
  std::vector<std::byte> host_src(kBytes);
  fill_pattern(host_src, 51);
  ASSERT_TRUE(engine->register_memory(device_src.get(), kBytes, kCuda0).ok());
  ASSERT_TRUE(engine->register_memory(host_src.data(), kBytes).ok());
  PeerHandle p = open_tcp(*engine, peer.endpoint);
  TransferOp device_op{OpKind::kWrite, device_src.addr(), peer.addr, kBytes};
  TransferOp host_op{OpKind::kWrite, reinterpret_cast<uint64_t>(host_src.data()), peer.host_addr,
                     kBytes};
  TransferOp device_read{OpKind::kRead, device_src.addr(), peer.addr, kBytes};
  TransferOp host_read{OpKind::kRead, reinterpret_cast<uint64_t>(host_src.data()), peer.host_addr,
                       kBytes};
  auto timed = [&](const TransferOp& op) {
    auto t0 = std::chrono::steady_clock::now();
    Status s = engine->transfer_sync(p, {&op, 1});
    EXPECT_TRUE(s.ok()) << s.to_string();
    return Seconds(std::chrono::steady_clock::now() - t0).count();
  };
  timed(device_op);  // warm-up: lanes, staging buffers, landers
  timed(host_op);
  std::vector<double> device_s, host_s;
  for (int r = 0; r < kRounds; ++r) {  // taking turns, so drift hits both alike
    device_s.push_back(timed(device_op));
    host_s.push_back(timed(host_op));
  }
  EXPECT_EQ(peer.ask(fmt::format("verify 51 0 {}", kBytes)), "ok");
  EXPECT_EQ(peer.ask(fmt::format("hverify 51 0 {}", kBytes)), "ok");
  // READs back (the peer's device memory into ours, its host memory into ours), same turns.
  timed(device_read);
  timed(host_read);
  std::vector<double> device_read_s, host_read_s;
  for (int r = 0; r < kRounds; ++r) {
    device_read_s.push_back(timed(device_read));
    host_read_s.push_back(timed(host_read));
  }
  EXPECT_EQ(device_src.mismatch(51, 0, kBytes), -1);
  EXPECT_FALSE(find_pattern_mismatch(host_src, 51));
  auto median_gbps = [&](std::vector<double>& seconds) {
    std::sort(seconds.begin(), seconds.end());
    return kBytes / seconds[kRounds / 2] / 1e9;
  };
  const double device_gbps = median_gbps(device_s);
  const double host_gbps = median_gbps(host_s);
  const double device_read_gbps = median_gbps(device_read_s);
  const double host_read_gbps = median_gbps(host_read_s);
  const std::string line = fmt::format(
      "tcp_device device->device {:.2f} GB/s, host->host {:.2f} GB/s, ratio {:.2f} "
      "(256 MiB writes, median of {} rounds, loopback)\n"
      "tcp_device_read device<-device {:.2f} GB/s, host<-host {:.2f} GB/s, ratio {:.2f} "
      "(256 MiB reads, median of {} rounds, loopback)",
      device_gbps, host_gbps, device_gbps / host_gbps, kRounds, device_read_gbps, host_read_gbps,
      device_read_gbps / host_read_gbps, kRounds);
  std::cout << line << std::endl;
  if (const char* out = std::getenv("KVFERRY_CUDA_BENCH_OUT"); out != nullptr) {
    std::ofstream(out, std::ios::app) << line << "\n";
  }
}

}  // namespace
}  // namespace kvferry::cuda_ipc::testing
