// Engine metrics (EngineOptions::metrics): what a transfer moves is what is counted, failures
// are counted by code, and an engine without metrics counts nothing.
#include <gtest/gtest.h>

#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::must;

std::unique_ptr<TransferEngine> engine_with_metrics(const std::string& name, bool metrics) {
  EngineOptions options;
  options.name = name;
  options.metrics = metrics;
  return must(TransferEngine::create(options));
}

class EngineMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = engine_with_metrics("m", true);
    src_.resize(kBytes);
    dst_.assign(kBytes, std::byte{0});
    fill_pattern(src_, 11);
    ASSERT_TRUE(engine_->register_memory(src_.data(), kBytes).ok());
    ASSERT_TRUE(engine_->register_memory(dst_.data(), kBytes).ok());
    self_ = must(engine_->open_peer(engine_->endpoint()));
  }
  static constexpr size_t kBytes = 1u << 20;
  std::unique_ptr<TransferEngine> engine_;
  std::vector<std::byte> src_, dst_;
  PeerHandle self_;
};

TEST_F(EngineMetricsTest, CountsTheBytesOpsAndLatencyOfWhatMoved) {
  // Two contiguous writes (merged into one posted op) and one read.
  std::vector<TransferOp> writes = {
      {OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), 4096},
      {OpKind::kWrite, addr_of(src_.data() + 4096), addr_of(dst_.data() + 4096), 4096}};
  ASSERT_TRUE(engine_->transfer_sync(self_, writes).ok());
  TransferOp read{OpKind::kRead, addr_of(dst_.data() + 65536), addr_of(src_.data() + 65536), 1000};
  ASSERT_TRUE(engine_->transfer_sync(self_, {&read, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(std::span(dst_).first(8192), 11).has_value());

  MetricsSnapshot m = engine_->metrics();
  const MetricLabels local_write = {
      {"engine", "m"}, {"transport", "local"}, {"direction", "write"}};
  const MetricLabels local_read = {{"engine", "m"}, {"transport", "local"}, {"direction", "read"}};
  EXPECT_EQ(m.value("kvferry_engine_bytes_total", local_write), 8192);
  EXPECT_EQ(m.value("kvferry_engine_bytes_total", local_read), 1000);
  EXPECT_EQ(m.value("kvferry_engine_bytes_total", {{"transport", "shm"}}), 0);
  EXPECT_EQ(m.value("kvferry_engine_batches_total", local_write), 1);
  EXPECT_EQ(m.value("kvferry_engine_batches_submitted_total"), 2);
  EXPECT_EQ(m.value("kvferry_engine_ops_total", {{"stage", "submitted"}}), 3);
  EXPECT_EQ(m.value("kvferry_engine_ops_total", {{"stage", "posted"}}), 2);
  EXPECT_EQ(m.value("kvferry_engine_batches_in_flight"), 0);
  const MetricPoint* latency =
      m.find("kvferry_engine_batch_latency_seconds", {{"transport", "local"}});
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->count, 2u);
  EXPECT_GT(latency->sum, 0);
  ASSERT_FALSE(latency->cumulative_counts.empty());
  EXPECT_LE(latency->cumulative_counts.back(), 2u);
  EXPECT_EQ(m.value("kvferry_engine_registered_bytes", {{"memory", "host"}}), 2.0 * kBytes);
  // Its own endpoint is not a peer; another engine is.
  EXPECT_EQ(m.value("kvferry_engine_peers", {{"state", "connected"}}), 0);
  auto other = engine_with_metrics("other", false);
  must(engine_->open_peer(other->endpoint()));
  m = engine_->metrics();
  EXPECT_EQ(m.value("kvferry_engine_peers", {{"state", "connected"}}), 1);
  EXPECT_EQ(m.value("kvferry_engine_peers", {{"state", "disconnected"}}), 0);
}

TEST_F(EngineMetricsTest, FailuresAreCountedByStatusCode) {
  Result<BatchHandle> batch = engine_->submit(
      self_,
      std::vector<TransferOp>{{OpKind::kWrite, addr_of(src_.data()), addr_of(dst_.data()), kBytes}},
      SubmitOptions{});
  ASSERT_TRUE(batch.ok());
  engine_->cancel(*batch);
  BatchStatus s = engine_->wait(*batch, std::chrono::seconds(5));
  MetricsSnapshot m = engine_->metrics();
  if (s.state == BatchState::kCompleted) {
    EXPECT_EQ(m.value("kvferry_engine_batches_completed_total", {{"transport", "local"}}), 1);
  } else {
    EXPECT_EQ(s.status.code(), StatusCode::kCancelled);
    EXPECT_EQ(m.value("kvferry_engine_batch_failures_total", {{"code", "Cancelled"}}), 1);
  }
  EXPECT_EQ(m.value("kvferry_engine_batches_in_flight"), 0);
  // Refused before posting: not a batch, not counted.
  TransferOp outside{OpKind::kWrite, addr_of(src_.data()), 1, 8};
  EXPECT_FALSE(engine_->submit(self_, {&outside, 1}).ok());
  EXPECT_EQ(engine_->metrics().value("kvferry_engine_batches_submitted_total"), 1);
}

TEST(EngineMetricsOff, CountsNothingAndSnapshotIsEmpty) {
  auto engine = engine_with_metrics("off", false);
  std::vector<std::byte> a(4096), b(4096);
  fill_pattern(a, 3);
  ASSERT_TRUE(engine->register_memory(a.data(), a.size()).ok());
  ASSERT_TRUE(engine->register_memory(b.data(), b.size()).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  TransferOp op{OpKind::kWrite, addr_of(a.data()), addr_of(b.data()), 4096};
  ASSERT_TRUE(engine->transfer_sync(self, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(b, 3).has_value());
  EXPECT_TRUE(engine->metrics().families.empty());
}

}  // namespace
}  // namespace kvferry
