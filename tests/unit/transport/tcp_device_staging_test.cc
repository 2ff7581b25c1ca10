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
#include "transport/tcp/tcp_staging_pool.h"
#include "transport/tcp/tcp_transport.h"
#include "unit/transport/fake_cuda_memory_api.h"

namespace kvferry {
namespace {

using testing::FakeCudaMemoryApi;
using testing::must;

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }
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

PeerHandle open_tcp(TransferEngine& from, const TransferEngine& to) {
  PeerOptions o;
  o.transport = TransportKind::kTcp;
  return must(from.open_peer(to.endpoint(), o));
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

  std::shared_ptr<FakeCudaMemoryApi> sender_api_ = std::make_shared<FakeCudaMemoryApi>();
  std::shared_ptr<FakeCudaMemoryApi> receiver_api_ = std::make_shared<FakeCudaMemoryApi>();
  std::vector<std::byte> src_, dst_;
  std::unique_ptr<TransferEngine> prefill_, decode_;
  PeerHandle peer_;
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
  std::vector<std::byte> host_src(1u << 20), host_dst(1u << 20, std::byte{0});
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
  // Whatever landed, landed before the end: the destination does not change afterwards.
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
  std::vector<std::byte> host_src(4096), host_dst(4096, std::byte{0});
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

TEST_F(TcpDeviceStaging, ReadOfDeviceMemoryIsRefusedBeforeAnythingMoves) {
  TransferOp op{OpKind::kRead, addr_of(src_.data()), addr_of(dst_.data()), 4096};
  auto b = prefill_->submit(peer_, {&op, 1});
  Status s = b.ok() ? prefill_->wait(*b, std::chrono::seconds(10)).status : b.status();
  EXPECT_EQ(s.code(), StatusCode::kNotSupported) << s.to_string();
  EXPECT_NE(s.message().find("WRITEs only"), std::string::npos) << s.to_string();
  EXPECT_EQ(sender_api_->copies_run(), 0u);
}

}  // namespace
}  // namespace kvferry
