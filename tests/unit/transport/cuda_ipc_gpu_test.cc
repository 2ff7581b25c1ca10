// cuda_ipc with real device memory. Every test here skips (GTEST_SKIP, with the reason)
// where no CUDA device is usable, except the one that checks what happens then.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <random>
#include <thread>

#include "unit/transport/cuda_ipc_gpu_support.h"

namespace kvferry::cuda_ipc::testing {
namespace {

using kvferry::testing::contains;
using kvferry::testing::make_engine;
using kvferry::testing::must;

// The peer process of the two-process tests (see cuda_ipc_gpu_support.h).
TEST(CudaIpcPeer, Serve) {
  const char* bytes_text = std::getenv(kPeerEnv);
  if (bytes_text == nullptr) GTEST_SKIP() << "helper: runs only as the peer of CudaIpcTwoProcess";
  KVF_SKIP_WITHOUT_GPU();
  CudaBuffer memory = CudaBuffer::device(std::stoull(bytes_text));
  auto engine = make_engine("gpu-peer");
  ASSERT_TRUE(
      engine->register_memory(memory.get(), memory.bytes(), {MemoryLocation::Kind::kCuda, 0}).ok());
  // With KVFERRY_CUDA_IPC_PEER_HOST set, host memory of the same size too (tcp's benchmark
  // compares device memory with it), checked with "hverify".
  std::vector<std::byte> host;
  if (std::getenv(kPeerHostEnv) != nullptr) {
    host.assign(memory.bytes(), std::byte{0});
    ASSERT_TRUE(engine->register_memory(host.data(), host.size()).ok());
  }
  std::cout << "peer " << engine->endpoint() << " " << memory.addr() << " "
            << reinterpret_cast<uint64_t>(host.data()) << std::endl;
  std::string command;
  uint64_t seed = 0, offset = 0, len = 0;
  while (std::cin >> command >> seed >> offset >> len) {
    if (command == "fill") {
      memory.fill(seed, offset, len);
      std::cout << "reply ok" << std::endl;
    } else if (command == "hverify") {
      auto at = offset + len <= host.size()
                    ? find_pattern_mismatch({host.data() + offset, len}, seed, offset)
                    : std::optional<size_t>(0);
      std::cout << (at ? fmt::format("reply mismatch {}", *at) : std::string("reply ok"))
                << std::endl;
    } else {
      int64_t at = memory.mismatch(seed, offset, len);
      std::cout << (at < 0 ? std::string("reply ok") : fmt::format("reply mismatch {}", at))
                << std::endl;
    }
  }
}

TEST(CudaIpcNoDevice, RegisteringDeviceMemoryIsNotSupportedNamingWhy) {
  if (no_device_reason().empty()) GTEST_SKIP() << "a CUDA device exists: this checks its absence";
  auto engine = make_engine("no-gpu");
  std::vector<std::byte> pretend(4096);
  Status s =
      engine->register_memory(pretend.data(), pretend.size(), {MemoryLocation::Kind::kCuda, 0});
  EXPECT_EQ(s.code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(s.message(), "cuda:0 memory: no CUDA device: ")) << s.message();
  // Host memory is unaffected.
  EXPECT_TRUE(engine->register_memory(pretend.data(), pretend.size()).ok());
}

TEST(CudaIpcGpu, RegistrationRefusesHostMemoryAndTheWrongDevice) {
  KVF_SKIP_WITHOUT_GPU();
  auto engine = make_engine("gpu");
  CudaBuffer pinned = CudaBuffer::pinned_host(4096);
  Status as_device = engine->register_memory(pinned.get(), 4096, {MemoryLocation::Kind::kCuda, 0});
  EXPECT_EQ(as_device.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(as_device.message(), "pinned host memory")) << as_device.message();
  CudaBuffer device = CudaBuffer::device(4096);
  Status wrong = engine->register_memory(device.get(), 4096, {MemoryLocation::Kind::kCuda, 7});
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(engine->register_memory(pinned.get(), 4096).ok());  // pinned host as host
}

TEST(CudaIpcGpu, InProcessDeviceToDeviceAndPinnedHostCopiesArriveIntact) {
  KVF_SKIP_WITHOUT_GPU();
  auto engine = make_engine("gpu");
  constexpr uint64_t kBytes = 8 << 20;
  CudaBuffer a = CudaBuffer::device(kBytes), b = CudaBuffer::device(kBytes);
  CudaBuffer pinned = CudaBuffer::pinned_host(kBytes);
  ASSERT_TRUE(engine->register_memory(a.get(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  ASSERT_TRUE(engine->register_memory(b.get(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  ASSERT_TRUE(engine->register_memory(pinned.get(), kBytes).ok());
  a.fill(21, 0, kBytes);
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  TransferOp d2d{OpKind::kWrite, a.addr(), b.addr(), kBytes};
  ASSERT_TRUE(engine->transfer_sync(self, {&d2d, 1}).ok());
  EXPECT_EQ(b.mismatch(21, 0, kBytes), -1);
  TransferOp d2h{OpKind::kRead, pinned.addr(), b.addr(), kBytes};
  ASSERT_TRUE(engine->transfer_sync(self, {&d2h, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch({static_cast<std::byte*>(pinned.get()), kBytes}, 21));
}

// A stream held by a host function until `release` is set: the producer's kernels, stalled.
struct HeldStream {
  HeldStream() {
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaLaunchHostFunc(
                  stream,
                  [](void* flag) {
                    while (!static_cast<std::atomic<bool>*>(flag)->load())
                      std::this_thread::yield();
                  },
                  &release),
              cudaSuccess);
    EXPECT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
    EXPECT_EQ(cudaEventRecord(done, stream), cudaSuccess);
  }
  ~HeldStream() {
    release.store(true);
    cudaStreamSynchronize(stream);
    cudaEventDestroy(done);
    cudaStreamDestroy(stream);
  }
  std::atomic<bool> release{false};
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;
};

TEST(CudaIpcGpu, AfterCudaEventOrdersTheCopyWithoutBlockingTheSubmitter) {
  KVF_SKIP_WITHOUT_GPU();
  auto engine = make_engine("gpu");
  constexpr uint64_t kBytes = 1 << 20;
  CudaBuffer a = CudaBuffer::device(kBytes), b = CudaBuffer::device(kBytes);
  ASSERT_TRUE(engine->register_memory(a.get(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  ASSERT_TRUE(engine->register_memory(b.get(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  a.fill(5, 0, kBytes);
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  HeldStream producer;
  TransferOp op{OpKind::kWrite, a.addr(), b.addr(), kBytes};
  SubmitOptions after;
  after.after_cuda_event = producer.done;
  BatchHandle batch = must(engine->submit(self, {&op, 1}, after));  // returns while held
  EXPECT_EQ(engine->wait(batch, std::chrono::milliseconds(200)).state, BatchState::kPending);
  producer.release.store(true);
  BatchStatus s = engine->wait(batch, std::chrono::seconds(10));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(b.mismatch(5, 0, kBytes), -1);
}

TEST(CudaIpcTwoProcess, TenThousandScatteredDeviceWritesAndPinnedHostWritesArriveIntact) {
  KVF_SKIP_WITHOUT_GPU();
  constexpr uint64_t kOps = 10'000, kOpBytes = 4096, kTarget = 2 * kOps * kOpBytes;
  GpuPeer peer = must(start_gpu_peer(kTarget));
  auto engine = make_engine("gpu-initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCudaIpc);
  CudaBuffer src = CudaBuffer::device(kOps * kOpBytes);
  CudaBuffer pinned = CudaBuffer::pinned_host(kOps * kOpBytes);
  ASSERT_TRUE(
      engine->register_memory(src.get(), src.bytes(), {MemoryLocation::Kind::kCuda, 0}).ok());
  ASSERT_TRUE(engine->register_memory(pinned.get(), pinned.bytes()).ok());
  // Op i writes slot perm[i] (every other slot), in random order: nothing merges. Source
  // bytes are the pattern at the destination offset, so the peer checks them on its own.
  std::vector<uint64_t> perm(kOps);
  for (uint64_t i = 0; i < kOps; ++i) perm[i] = 2 * i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  std::vector<std::byte> staging(kOps * kOpBytes);
  std::vector<TransferOp> device_ops, host_ops;
  for (uint64_t i = 0; i < kOps; ++i) {
    fill_pattern({staging.data() + i * kOpBytes, kOpBytes}, 31, perm[i] * kOpBytes);
    device_ops.push_back(
        {OpKind::kWrite, src.addr() + i * kOpBytes, peer.addr + perm[i] * kOpBytes, kOpBytes});
    host_ops.push_back({OpKind::kWrite, pinned.addr() + i * kOpBytes,
                        peer.addr + (perm[i] + 1) * kOpBytes, kOpBytes});
  }
  ASSERT_EQ(cudaMemcpy(src.get(), staging.data(), staging.size(), cudaMemcpyDefault), cudaSuccess);
  BatchHandle batch = must(engine->submit(handle, device_ops));
  BatchStatus s = engine->wait(batch, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.ops_posted, kOps);
  for (uint64_t i = 0; i < kOps; ++i) {
    fill_pattern({static_cast<std::byte*>(pinned.get()) + i * kOpBytes, kOpBytes}, 31,
                 (perm[i] + 1) * kOpBytes);
  }
  ASSERT_TRUE(engine->transfer_sync(handle, host_ops).ok());
  EXPECT_EQ(peer.ask(fmt::format("verify 31 0 {}", kTarget)), "ok");  // every byte
  // READ back into device memory.
  CudaBuffer back = CudaBuffer::device(kTarget);
  ASSERT_TRUE(engine->register_memory(back.get(), kTarget, {MemoryLocation::Kind::kCuda, 0}).ok());
  TransferOp read{OpKind::kRead, back.addr(), peer.addr, kTarget};
  ASSERT_TRUE(engine->transfer_sync(handle, {&read, 1}).ok());
  EXPECT_EQ(back.mismatch(31, 0, kTarget), -1);
}

TEST(CudaIpcTwoProcess, APeerKilledMidBatchEndsItInAnErrorNotAHang) {
  KVF_SKIP_WITHOUT_GPU();
  constexpr uint64_t kBytes = 64 << 20;
  GpuPeer peer = must(start_gpu_peer(kBytes));
  auto engine = make_engine("gpu-initiator");
  PeerHandle handle = must(engine->open_peer(peer.endpoint));
  ASSERT_EQ(handle.transport(), TransportKind::kCudaIpc);
  CudaBuffer src = CudaBuffer::device(kBytes);
  ASSERT_TRUE(engine->register_memory(src.get(), kBytes, {MemoryLocation::Kind::kCuda, 0}).ok());
  HeldStream producer;  // keeps the batch on the device while the peer dies
  TransferOp op{OpKind::kWrite, src.addr(), peer.addr, kBytes};
  SubmitOptions after;
  after.after_cuda_event = producer.done;
  BatchHandle batch = must(engine->submit(handle, {&op, 1}, after));
  peer.process.kill_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the pidfd monitor notices
  producer.release.store(true);
  auto started = std::chrono::steady_clock::now();
  BatchStatus s = engine->wait(batch, std::chrono::seconds(20));
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(15));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
  EXPECT_FALSE(engine->submit(handle, {&op, 1}).ok());
}

}  // namespace
}  // namespace kvferry::cuda_ipc::testing
