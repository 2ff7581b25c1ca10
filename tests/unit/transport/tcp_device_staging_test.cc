// tcp with device memory, staged through pinned host buffers, on a fake device: host memory
// posing as device memory (FakeCudaMemoryApi), so the whole pipeline — device -> staging
// on the sender, the wire, staging -> device on the receiver, acks after the device copy —
// runs on machines without a GPU. Two engines in this process, tcp forced.
#include <gtest/gtest.h>

#include <random>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "engine/engine_impl.h"
#include "test_support.h"
#include "transport/tcp/tcp_device_reader.h"
#include "transport/tcp/tcp_staging_pool.h"
#include "transport/tcp/tcp_transport.h"
#include "unit/transport/fake_cuda_memory_api.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::FakeCudaMemoryApi;
using testing::must;
using testing::open_tcp;

constexpr MemoryLocation kCuda0{MemoryLocation::Kind::kCuda, 0};

// The build's transports without cuda_ipc, with tcp staging through `api`.
std::vector<BuiltTransport> transports_with(std::shared_ptr<FakeCudaMemoryApi> api) {
  std::vector<BuiltTransport> out;
  for (BuiltTransport& t : built_transports()) {
    if (t.kind != TransportKind::kTcp && t.kind != TransportKind::kCudaIpc) {
      out.push_back(std::move(t));
    }
  }
  out.push_back({TransportKind::kTcp, [api](const TransportEnv& env) {
                   TransportEnv staged = env;
                   staged.open_cuda_api = [api]() -> Result<std::shared_ptr<CudaMemoryApi>> {
                     return std::shared_ptr<CudaMemoryApi>(api);
                   };
                   return make_tcp_transport(staged);
                 }});
  return out;
}

std::unique_ptr<TransferEngine> engine_with(const std::string& name,
                                            std::shared_ptr<FakeCudaMemoryApi> api,
                                            uint64_t staging_bytes = 256u << 10,
                                            int staging_buffers = 4) {
  EngineOptions o;
  o.name = name;
  o.tcp_staging_buffer_bytes = staging_bytes;
  o.tcp_staging_buffers = staging_buffers;
  return must(detail::EngineImpl::create_engine(o, transports_with(std::move(api))));
}

class TcpDeviceStaging : public ::testing::Test {
 protected:
  static constexpr size_t kBytes = 24u << 20;  // 96 chunks of 256 KiB, four staging buffers

  void SetUp() override {
    src_.resize(kBytes);
    dst_.assign(kBytes, std::byte{0});
    fill_pattern(src_, 7);
    sender_api_->pretend_device(src_.data(), kBytes);
    receiver_api_->pretend_device(dst_.data(), kBytes);
    prefill_ = engine_with("prefill", sender_api_);
    decode_ = engine_with("decode", receiver_api_);
    ASSERT_TRUE(prefill_->register_memory(src_.data(), kBytes, kCuda0).ok());
    ASSERT_TRUE(decode_->register_memory(dst_.data(), kBytes, kCuda0).ok());
    peer_ = open_tcp(*prefill_, *decode_);
  }

  BatchStatus write_all(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    TransferOp op{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), kBytes};
    SubmitOptions options;
    options.timeout = timeout;
    BatchHandle b = must(prefill_->submit(peer_, {&op, 1}, options));
    return prefill_->wait(b, timeout + std::chrono::seconds(10));
  }

  // decode READs prefill's device memory into its own (the vLLM decode side's direction).
  BatchStatus read_all(std::chrono::milliseconds timeout = std::chrono::seconds(30),
                       void* after_event = nullptr) {
    if (!read_peer_.valid()) read_peer_ = open_tcp(*decode_, *prefill_);
    TransferOp op{OpKind::kRead, addr_of(dst_.data()), addr_of(src_.data()), kBytes};
    SubmitOptions options;
    options.timeout = timeout;
    options.after_cuda_event = after_event;
    BatchHandle b = must(decode_->submit(read_peer_, {&op, 1}, options));
    return decode_->wait(b, timeout + std::chrono::seconds(10));
  }

  // Each 256 KiB chunk of dst_ holds either its own bytes or none (zeros): nothing of a chunk
  // whose copy failed arrived as if it were valid. Returns how many chunks arrived.
  size_t chunks_whole_or_absent() {
    constexpr size_t kChunk = 256u << 10;
    size_t whole = 0;
    for (size_t off = 0; off < kBytes; off += kChunk) {
      std::span<const std::byte> c{dst_.data() + off, kChunk};
      if (!find_pattern_mismatch(c, 7, off)) {
        ++whole;
        continue;
      }
      EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](std::byte b) { return b == std::byte{0}; }))
          << "chunk at " << off << " holds bytes that are neither its own nor zero";
    }
    return whole;
  }

  std::shared_ptr<FakeCudaMemoryApi> sender_api_ = std::make_shared<FakeCudaMemoryApi>();
  std::shared_ptr<FakeCudaMemoryApi> receiver_api_ = std::make_shared<FakeCudaMemoryApi>();
  // Every buffer the engines touch is declared before them, so their threads end before it
  // is freed (ThreadSanitizer does not see the order a socket's bytes give). host_a_ and
  // host_b_ are the host buffers of tests that mix host and device memory.
  std::vector<std::byte> src_, dst_, host_a_, host_b_;
  std::unique_ptr<TransferEngine> prefill_, decode_;
  PeerHandle peer_;
  PeerHandle read_peer_;
};

TEST_F(TcpDeviceStaging, DeviceToDeviceWriteArrivesWithManyChunksInFlight) {
  BatchStatus s = write_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  // Every byte went device -> staging on the sender and staging -> device on the receiver.
  EXPECT_EQ(sender_api_->device_to_host_copies(), kBytes / (256u << 10));
  EXPECT_GE(receiver_api_->host_to_device_copies(), kBytes / (256u << 10));
  // The sender's staging stayed within its bound: four buffers.
  EXPECT_EQ(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
}

TEST_F(TcpDeviceStaging, ScatteredOpsBetweenHostAndDeviceLandInTheirPlaces) {
  // Host source -> device target and device source -> host target, many small ops shuffled.
  std::vector<std::byte>& host_src = host_a_;
  std::vector<std::byte>& host_dst = host_b_;
  host_src.resize(1u << 20);
  host_dst.assign(1u << 20, std::byte{0});
  fill_pattern(host_src, 11);
  ASSERT_TRUE(prefill_->register_memory(host_src.data(), host_src.size()).ok());
  ASSERT_TRUE(decode_->register_memory(host_dst.data(), host_dst.size()).ok());
  constexpr size_t kOps = 512, kOpBytes = 2048;
  std::vector<size_t> slot(kOps);
  for (size_t i = 0; i < kOps; ++i) slot[i] = i;
  std::shuffle(slot.begin(), slot.end(), std::mt19937_64(5));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    // host -> device: host_src piece i to dst_ slot[i]
    ops.push_back({OpKind::kWrite, addr_of(host_src.data() + i * kOpBytes),
                   addr_of(dst_.data() + slot[i] * kOpBytes), kOpBytes});
    // device -> host: src_ slot[i] to host_dst piece i
    ops.push_back({OpKind::kWrite, addr_of(src_.data() + slot[i] * kOpBytes),
                   addr_of(host_dst.data() + i * kOpBytes), kOpBytes});
  }
  BatchHandle b = must(prefill_->submit(peer_, ops));
  BatchStatus s = prefill_->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(
        std::memcmp(dst_.data() + slot[i] * kOpBytes, host_src.data() + i * kOpBytes, kOpBytes), 0)
        << "op " << i;
    ASSERT_EQ(
        std::memcmp(host_dst.data() + i * kOpBytes, src_.data() + slot[i] * kOpBytes, kOpBytes), 0)
        << "op " << i;
  }
}

TEST_F(TcpDeviceStaging, ExhaustedStagingPoolStallsAndRecovers) {
  // A slow receiver (each staging -> device copy takes 2 ms) holds its acks back, so the
  // sender's four staging buffers are all leased by unacknowledged chunks and the other 92
  // chunks wait for one; the batch still completes, with nothing allocated beyond the bound.
  receiver_api_->copy_delay_us = 2000;
  BatchStatus s = write_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  EXPECT_EQ(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
  // A second batch reuses the same buffers.
  std::fill(dst_.begin(), dst_.end(), std::byte{0});
  receiver_api_->copy_delay_us = 0;
  s = write_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  EXPECT_EQ(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
}

TEST(TcpStagingPool, WaitsForALeaseAndTimesOutAtTheDeadlineWithoutAllocating) {
  auto api = std::make_shared<FakeCudaMemoryApi>();
  auto pool = must(TcpStagingPool::create(api, 64u << 10, 2));
  StagingLease a = must(pool->acquire(Clock::now() + std::chrono::seconds(1), nullptr));
  StagingLease b = must(pool->acquire(Clock::now() + std::chrono::seconds(1), nullptr));
  auto third = pool->acquire(Clock::now() + std::chrono::milliseconds(50), nullptr);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kTimeout);
  EXPECT_EQ(pool->buffers_allocated(), 2);
  // A lease that comes back wakes a waiter.
  std::thread giver([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    a.release();
  });
  auto fourth = pool->acquire(Clock::now() + std::chrono::seconds(10), nullptr);
  giver.join();
  ASSERT_TRUE(fourth.ok()) << fourth.status().to_string();
  EXPECT_EQ(pool->buffers_allocated(), 2);
  EXPECT_EQ(api->pinned_bytes_allocated(), 2u * (64u << 10));
  EXPECT_GE(pool->waits(), 2u);
  // A stop condition ends a wait with its reason.
  auto stopped = pool->acquire(Clock::now() + std::chrono::seconds(10),
                               [] { return Cancelled("batch cancelled"); });
  ASSERT_FALSE(stopped.ok());
  EXPECT_EQ(stopped.status().code(), StatusCode::kCancelled);
}

TEST(TcpStagingPool, RefusesBoundsOutOfRangeNamingThem) {
  auto api = std::make_shared<FakeCudaMemoryApi>();
  auto tiny = TcpStagingPool::create(api, 100, 2);
  ASSERT_FALSE(tiny.ok());
  EXPECT_NE(tiny.status().message().find("100"), std::string::npos);
  auto none = TcpStagingPool::create(api, 1u << 20, 0);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("tcp_staging_buffers 0"), std::string::npos);
}

TEST_F(TcpDeviceStaging, SenderCopyFailureFailsTheBatchAndNothingAfterItIsSent) {
  constexpr uint64_t kFailAt = 10;  // the tenth 256 KiB chunk's device -> host copy
  sender_api_->fail_copy_number = kFailAt;
  BatchStatus s = write_all();
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kInternal) << s.status.to_string();
  EXPECT_NE(s.status.message().find("staging buffer"), std::string::npos);
  // Nothing after the failed chunk was copied, hence nothing after it sent or acknowledged.
  EXPECT_EQ(sender_api_->copies_run(), kFailAt);
  const size_t chunk = 256u << 10;
  std::span<const std::byte> after{dst_.data() + (kFailAt - 1) * chunk,
                                   kBytes - (kFailAt - 1) * chunk};
  EXPECT_TRUE(
      std::all_of(after.begin(), after.end(), [](std::byte b) { return b == std::byte{0}; }));
  // The link stays usable: the next batch completes.
  sender_api_->fail_copy_number = 0;
  s = write_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, ReceiverCopyFailureIsNeverAcknowledgedAsDone) {
  receiver_api_->fail_copy_number = 5;  // the receiver's fifth staging -> device copy
  BatchStatus s = write_all();
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kInternal) << s.status.to_string();
  receiver_api_->fail_copy_number = 0;
  std::fill(dst_.begin(), dst_.end(), std::byte{0});
  s = write_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, DeadlineThatPassesWhileChunksAreStagedEndsInTimeoutAndNothingLandsLater) {
  // Each device copy takes 40 ms: the 96 chunks cannot finish in 300 ms.
  sender_api_->copy_delay_us = 40'000;
  BatchStatus s = write_all(std::chrono::milliseconds(300));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  // Whatever landed, landed before the end: once the landing copies begun before it are done,
  // the destination does not change.
  for (int i = 0; i < 5000 && !receiver_api_->copies_settled(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(receiver_api_->copies_settled());
  std::vector<std::byte> at_end = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(at_end, dst_);
  EXPECT_TRUE(find_pattern_mismatch(dst_, 7).has_value());  // not all of it arrived
}

TEST_F(TcpDeviceStaging, KilledPeerMidPipelineEndsTheBatchWithAnError) {
  sender_api_->copy_delay_us = 5'000;
  TransferOp op{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), kBytes};
  BatchHandle b = must(prefill_->submit(peer_, {&op, 1}));
  for (int i = 0; i < 2000 && sender_api_->copies_run() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(sender_api_->copies_run(), 8u);
  decode_.reset();  // the receiver goes away with chunks staged and on the wire
  BatchStatus s = prefill_->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
}

TEST_F(TcpDeviceStaging, AfterCudaEventOrdersTheFirstDeviceCopy) {
  int producer_event = 0;  // the fake only needs a non-null event
  TransferOp op{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), kBytes};
  SubmitOptions options;
  options.after_cuda_event = &producer_event;
  BatchHandle b = must(prefill_->submit(peer_, {&op, 1}, options));
  BatchStatus s = prefill_->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  EXPECT_EQ(sender_api_->streams_waiting_on_events(), 1);
}

TEST_F(TcpDeviceStaging, AfterCudaEventOnAHostOnlyBatchIsRefused) {
  std::vector<std::byte>& host_src = host_a_;
  std::vector<std::byte>& host_dst = host_b_;
  host_src.resize(4096);
  host_dst.assign(4096, std::byte{0});
  ASSERT_TRUE(prefill_->register_memory(host_src.data(), host_src.size()).ok());
  ASSERT_TRUE(decode_->register_memory(host_dst.data(), host_dst.size()).ok());
  int producer_event = 0;
  SubmitOptions options;
  options.after_cuda_event = &producer_event;
  TransferOp op{OpKind::kWrite, addr_of(host_src.data()), addr_of(host_dst.data()), 4096};
  auto b = prefill_->submit(peer_, {&op, 1}, options);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument) << b.status().to_string();
  EXPECT_NE(b.status().message().find("after_cuda_event"), std::string::npos);
}

// ---- READs of device memory: the remote (prefill) stages its device memory, the local
// (decode) lands the payload in its own. sender_api_ is the READ's source side.

TEST_F(TcpDeviceStaging, DeviceToDeviceReadArrivesWithManyChunksInFlight) {
  BatchStatus s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  // Every byte went device -> staging on the source and staging -> device on the reader.
  EXPECT_EQ(sender_api_->device_to_host_copies(), kBytes / (256u << 10));
  EXPECT_EQ(receiver_api_->host_to_device_copies(), kBytes / (256u << 10));
  // The source's staging for READ answers stayed within its bound: four buffers.
  EXPECT_LE(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
  // A second READ stays within the same bound (buffers are allocated on first need and kept).
  std::fill(dst_.begin(), dst_.end(), std::byte{0});
  s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  EXPECT_LE(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
}

TEST_F(TcpDeviceStaging, ScatteredReadsBetweenHostAndDeviceLandInTheirPlaces) {
  // The remote's device memory -> local host memory, and the remote's host memory -> local
  // device memory, many small ops shuffled in one batch.
  std::vector<std::byte>& remote_host = host_a_;
  std::vector<std::byte>& local_host = host_b_;
  remote_host.resize(1u << 20);
  local_host.assign(1u << 20, std::byte{0});
  fill_pattern(remote_host, 11);
  ASSERT_TRUE(prefill_->register_memory(remote_host.data(), remote_host.size()).ok());
  ASSERT_TRUE(decode_->register_memory(local_host.data(), local_host.size()).ok());
  constexpr size_t kOps = 512, kOpBytes = 2048;
  std::vector<size_t> slot(kOps);
  for (size_t i = 0; i < kOps; ++i) slot[i] = i;
  std::shuffle(slot.begin(), slot.end(), std::mt19937_64(9));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    ops.push_back({OpKind::kRead, addr_of(local_host.data() + i * kOpBytes),
                   addr_of(src_.data() + slot[i] * kOpBytes), kOpBytes});
    ops.push_back({OpKind::kRead, addr_of(dst_.data() + slot[i] * kOpBytes),
                   addr_of(remote_host.data() + i * kOpBytes), kOpBytes});
  }
  PeerHandle peer = open_tcp(*decode_, *prefill_);
  BatchHandle b = must(decode_->submit(peer, ops));
  BatchStatus s = decode_->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  for (size_t i = 0; i < kOps; ++i) {
    ASSERT_EQ(
        std::memcmp(local_host.data() + i * kOpBytes, src_.data() + slot[i] * kOpBytes, kOpBytes),
        0)
        << "op " << i;
    ASSERT_EQ(
        std::memcmp(dst_.data() + slot[i] * kOpBytes, remote_host.data() + i * kOpBytes, kOpBytes),
        0)
        << "op " << i;
  }
}

TEST_F(TcpDeviceStaging, SlowReaderKeepsTheSourcesStagingBoundedAndCompletes) {
  // The reader lands slowly (2 ms per 256 KiB copy), so the source's answers back up in its
  // sockets and its four staging buffers stay leased by unsent answers; the others wait.
  receiver_api_->copy_delay_us = 2000;
  BatchStatus s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  EXPECT_LE(sender_api_->pinned_bytes_allocated(), 4u * (256u << 10));
  receiver_api_->copy_delay_us = 0;
  std::fill(dst_.begin(), dst_.end(), std::byte{0});
  s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, SourceCopyFailureFailsTheReadAndNoByteOfItArrivesAsValid) {
  // The source's tenth device -> staging copy fails: its staging buffer holds another
  // chunk's bytes, which must not be sent as this chunk's.
  sender_api_->fail_copy_number = 10;
  BatchStatus s = read_all();
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kInternal) << s.status.to_string();
  EXPECT_LT(chunks_whole_or_absent(), kBytes / (256u << 10));
  // The link and the source stay usable.
  sender_api_->fail_copy_number = 0;
  s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, LandingCopyFailureFailsTheReadAndTheLinkRecovers) {
  receiver_api_->fail_copy_number = 5;  // the reader's fifth staging -> device copy
  BatchStatus s = read_all();
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kInternal) << s.status.to_string();
  EXPECT_NE(s.status.message().find("device memory"), std::string::npos) << s.status.to_string();
  receiver_api_->fail_copy_number = 0;
  std::fill(dst_.begin(), dst_.end(), std::byte{0});
  s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, KilledSourceMidReadPipelineEndsTheReadWithPeerDisconnected) {
  sender_api_->copy_delay_us = 5'000;
  read_peer_ = open_tcp(*decode_, *prefill_);
  TransferOp op{OpKind::kRead, addr_of(dst_.data()), addr_of(src_.data()), kBytes};
  BatchHandle b = must(decode_->submit(read_peer_, {&op, 1}));
  for (int i = 0; i < 2000 && sender_api_->copies_run() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(sender_api_->copies_run(), 8u);
  prefill_.reset();  // the source goes away with answers staged, queued and on the wire
  BatchStatus s = decode_->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kPeerDisconnected) << s.status.to_string();
  chunks_whole_or_absent();
}

TEST_F(TcpDeviceStaging, DeadlineWhileTheSourceStagesEndsTheReadAndNothingLandsLater) {
  sender_api_->copy_delay_us = 40'000;  // 96 chunks cannot be staged in 300 ms
  BatchStatus s = read_all(std::chrono::milliseconds(300));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  std::vector<std::byte> at_end = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(at_end, dst_);
  EXPECT_LT(chunks_whole_or_absent(), kBytes / (256u << 10));
}

TEST_F(TcpDeviceStaging, DeadlineWhileTheReaderLandsEndsTheReadAndNothingLandsLater) {
  receiver_api_->copy_delay_us = 40'000;  // each landing copy takes 40 ms
  BatchStatus s = read_all(std::chrono::milliseconds(300));
  ASSERT_EQ(s.state, BatchState::kFailed);
  EXPECT_EQ(s.status.code(), StatusCode::kTimeout) << s.status.to_string();
  std::vector<std::byte> at_end = dst_;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(at_end, dst_);
  EXPECT_LT(chunks_whole_or_absent(), kBytes / (256u << 10));
  // The link recovers.
  receiver_api_->copy_delay_us = 0;
  s = read_all();
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
}

TEST_F(TcpDeviceStaging, AfterCudaEventOrdersEveryLandingCopyOfARead) {
  int producer_event = 0;  // the fake only needs a non-null event
  BatchStatus s = read_all(std::chrono::seconds(30), &producer_event);
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_FALSE(find_pattern_mismatch(dst_, 7));
  // The chunks land on several lanes' streams: each stream waits before its chunk's copy.
  EXPECT_EQ(receiver_api_->streams_waiting_on_events(), static_cast<int>(kBytes / (256u << 10)));
  EXPECT_EQ(sender_api_->streams_waiting_on_events(), 0);  // the remote's copies are its own
}

// The receiver's read stager on its own: a pool of two 64 KiB buffers, answers held by "the
// socket" (the test) until it releases them.
class TcpDeviceReadStagerTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kBuf = 64u << 10;

  void SetUp() override {
    device_.resize(16 * kBuf);
    fill_pattern(device_, 3);
    api_->pretend_device(device_.data(), device_.size());
    pool_ = must(TcpStagingPool::create(api_, kBuf, 2));
    stager_ = must(TcpDeviceReadStager::start(api_, pool_));
  }

  void stage(uint64_t id, uint64_t offset, uint64_t length,
             std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    stager_->stage(inbox_, 1, id, reinterpret_cast<const char*>(device_.data() + offset), length, 0,
                   Clock::now() + timeout, alive_, nullptr);
  }

  // Waits (bounded) until `n` results in all have come back, collecting them.
  void collect(size_t n, std::vector<StagedRead>& into) {
    for (int i = 0; i < 5000 && into.size() < n; ++i) {
      for (StagedRead& r : inbox_->take()) into.push_back(std::move(r));
      if (into.size() < n) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  std::shared_ptr<FakeCudaMemoryApi> api_ = std::make_shared<FakeCudaMemoryApi>();
  std::vector<std::byte> device_;
  std::shared_ptr<TcpStagingPool> pool_;
  std::shared_ptr<PeerLiveness> alive_ = std::make_shared<PeerLiveness>("conn");
  std::atomic<int> woken_{0};
  std::shared_ptr<StagedReadInbox> inbox_ =
      std::make_shared<StagedReadInbox>([this] { woken_.fetch_add(1); });
  std::unique_ptr<TcpDeviceReadStager> stager_;
};

TEST_F(TcpDeviceReadStagerTest, ExhaustedPoolStallsUntilAnswersAreSentThenRecovers) {
  for (uint64_t i = 0; i < 6; ++i) stage(i + 1, i * kBuf, kBuf);
  std::vector<StagedRead> got;
  collect(2, got);
  ASSERT_EQ(got.size(), 2u);
  // Both buffers are held by answers not yet sent: nothing more is staged meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(inbox_->take().empty());
  EXPECT_EQ(pool_->buffers_allocated(), 2);
  EXPECT_GE(pool_->waits(), 1u);
  std::vector<StagedRead> all;
  // "Send" each answer as it comes (its leases return), verifying every byte.
  for (int round = 0; round < 5000 && all.size() < 6; ++round) {
    for (StagedRead& r : got) {
      ASSERT_TRUE(r.status.ok()) << r.status.to_string();
      ASSERT_EQ(r.pieces.size(), 1u);
      const uint64_t off = (r.request_id - 1) * kBuf;
      EXPECT_FALSE(find_pattern_mismatch(
          {reinterpret_cast<const std::byte*>(r.pieces[0].data()), kBuf}, 3, off))
          << "request " << r.request_id;
      r.pieces.clear();
      all.push_back(std::move(r));
    }
    got = inbox_->take();
    if (got.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(all.size(), 6u);
  EXPECT_EQ(pool_->buffers_allocated(), 2);
  EXPECT_GE(woken_.load(), 6);
}

TEST_F(TcpDeviceReadStagerTest, AFailedPieceFailsItsRequestWithoutBytesAndLaterPiecesAreNotCopied) {
  api_->fail_copy_number = 1;  // the first piece of a two-piece request
  stage(7, 0, 2 * kBuf);
  std::vector<StagedRead> got;
  collect(1, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), StatusCode::kInternal) << got[0].status.to_string();
  EXPECT_TRUE(got[0].pieces.empty());
  EXPECT_EQ(api_->copies_run(), 1u);
  // The next request is served whole.
  api_->fail_copy_number = 0;
  stage(8, kBuf, 2 * kBuf);
  got.clear();
  collect(1, got);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0].status.ok()) << got[0].status.to_string();
  ASSERT_EQ(got[0].pieces.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(find_pattern_mismatch(
        {reinterpret_cast<const std::byte*>(got[0].pieces[i].data()), kBuf}, 3, (1 + i) * kBuf));
  }
}

TEST_F(TcpDeviceReadStagerTest, ARequestLargerThanThePoolIsRefusedNamingItsSize) {
  stage(9, 0, 3 * kBuf);  // three buffers, the pool has two
  std::vector<StagedRead> got;
  collect(1, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(got[0].status.message().find(std::to_string(3 * kBuf)), std::string::npos)
      << got[0].status.to_string();
  EXPECT_EQ(api_->copies_run(), 0u);
}

TEST_F(TcpDeviceReadStagerTest, AClosedConnectionOrAPassedDeadlineStopsStaging) {
  stage(1, 0, kBuf);
  stage(2, kBuf, kBuf);
  std::vector<StagedRead> held;
  collect(2, held);  // both buffers held
  ASSERT_EQ(held.size(), 2u);
  stage(3, 2 * kBuf, kBuf, std::chrono::milliseconds(50));  // waits for a buffer, then expires
  std::vector<StagedRead> got;
  collect(1, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), StatusCode::kTimeout) << got[0].status.to_string();
  stage(4, 3 * kBuf, kBuf);
  alive_->mark_disconnected("closed");  // the connection goes while it waits
  got.clear();
  collect(1, got);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status.code(), StatusCode::kPeerDisconnected) << got[0].status.to_string();
  EXPECT_EQ(api_->copies_run(), 2u);
}

}  // namespace
}  // namespace kvferry
