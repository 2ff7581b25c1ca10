// Attack class: a frame whose bytes trickle in. A kWrite's payload sent one byte at a time,
// each byte well inside the receiver's stall timeout, would keep its target region pinned
// for as long as the trickle lasts (48 days for 1 MiB at one byte every 4 s), and
// unregister_memory of that region could not complete. The receiver measures a frame from
// its first byte: once it has taken longer than the frame-rest timeout as a whole, the
// connection is closed, nothing of the frame is acknowledged, and the pin is released.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "hostile_clients.h"
#include "raw_tcp_client.h"
#include "test_support.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kTrickleRegionBytes = 1ull << 20;
constexpr uint64_t kWriteBytes = 4096;
constexpr uint64_t kRegionSeed = 30;
constexpr uint64_t kTrickleSeed = 31;
constexpr uint64_t kTransferSeed = 32;
// The attack, scaled down: one byte every 200 ms against a 2 s stall timeout (every byte
// is progress) and a 1 s frame-rest timeout.
constexpr auto kTrickleInterval = 200ms;
constexpr auto kStallTimeout = 2s;
constexpr auto kFrameRestTimeout = 1s;
// What the receiver may take beyond the timeout: its limit checks run every 20 ms, and this
// test polls unregister_memory every 20 ms, on a loaded machine.
constexpr auto kReleaseSlack = 500ms;

class TrickledFrame : public ::testing::Test {
 protected:
  void SetUp() override {
    EngineOptions options;
    options.name = "trickle-target";
    options.tcp_stall_timeout = kStallTimeout;
    options.frame_rest_timeout = kFrameRestTimeout;
    target_ = must(TransferEngine::create(options));
    region_.resize(kTrickleRegionBytes);
    fill_pattern(region_, kRegionSeed);
    ASSERT_TRUE(target_->register_memory(region_.data(), region_.size()).ok());
    tcp_endpoint_ = must(fetch_tcp_endpoint(target_->endpoint()));
  }

  // An engine forced onto tcp writes random bytes into the whole region; every byte arrives.
  void expect_transfer_lands(uint64_t seed) {
    EngineOptions options;
    options.name = "trickle-bystander";
    options.forced_transport = TransportKind::kTcp;
    options.frame_rest_timeout = kFrameRestTimeout;
    auto initiator = must(TransferEngine::create(options));
    std::vector<std::byte> source(kTrickleRegionBytes);
    fill_pattern(source, seed);
    ASSERT_TRUE(initiator->register_memory(source.data(), source.size()).ok());
    PeerHandle peer = must(initiator->open_peer(target_->endpoint()));
    std::vector<TransferOp> ops = {{OpKind::kWrite, reinterpret_cast<uint64_t>(source.data()),
                                    reinterpret_cast<uint64_t>(region_.data()),
                                    kTrickleRegionBytes}};
    BatchHandle batch = must(initiator->submit(peer, ops));
    BatchStatus done = initiator->wait(batch, 10s);
    ASSERT_EQ(done.state, BatchState::kCompleted) << done.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(region_, seed)) << "the transfer's bytes did not land";
  }

  std::unique_ptr<TransferEngine> target_;
  std::vector<std::byte> region_;
  Endpoint tcp_endpoint_;
};

TEST_F(TrickledFrame, TrickledWriteFrameReleasesItsPinWithinTheFrameRestTimeout) {
  RawTcpClient attacker = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(attacker.hello().ok());
  TcpHeader write;
  write.type = TcpFrame::kWrite;
  write.request_id = 1;
  write.addr = reinterpret_cast<uint64_t>(region_.data());
  write.length = kWriteBytes;
  write.deadline_ns = 0;  // no deadline either: only the frame-rest timeout can end it
  std::vector<std::byte> payload(kWriteBytes);
  fill_pattern(payload, kTrickleSeed);

  std::atomic<uint64_t> trickled{0};
  std::atomic<bool> stop{false};
  const auto began = Clock::now();
  attacker.send(write);  // the frame's first bytes
  std::thread trickle([&] {
    for (uint64_t i = 0; i < kWriteBytes && !stop.load(); ++i) {
      if (send_now(attacker.fd(), std::span(payload).subspan(i, 1)) != 1) return;  // closed
      trickled.store(i + 1);
      std::this_thread::sleep_for(kTrickleInterval);
    }
  });

  // The frame is under way and its bytes keep coming: the region is pinned.
  ASSERT_TRUE(eventually([&] { return trickled.load() >= 2; }, 2s));
  Status pinned = target_->unregister_memory(region_.data());
  EXPECT_EQ(pinned.code(), StatusCode::kFailedPrecondition) << pinned.to_string();

  // Released once the frame as a whole took longer than the frame-rest timeout.
  Status unregistered;
  ASSERT_TRUE(eventually(
      [&] {
        unregistered = target_->unregister_memory(region_.data());
        return unregistered.ok();
      },
      kFrameRestTimeout + 5s))
      << unregistered.to_string();
  const auto released_after = Clock::now() - began;
  const uint64_t sent_before_release = trickled.load();
  std::printf(
      "trickled write: %llu bytes sent, pin released %lld ms after the frame began "
      "(frame-rest timeout %lld ms)\n",
      static_cast<unsigned long long>(sent_before_release),
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(released_after).count()),
      static_cast<long long>(std::chrono::milliseconds(kFrameRestTimeout).count()));
  EXPECT_GE(released_after, kFrameRestTimeout);
  EXPECT_LE(released_after, kFrameRestTimeout + kReleaseSlack);

  // Closed without a byte in answer: no part of the frame counts as a completed write.
  std::string what;
  EXPECT_TRUE(attacker.closed_by_peer(what, 2s)) << what;
  stop.store(true);
  trickle.join();

  // The bytes that arrived are a prefix of the attacker's payload; nothing else changed.
  size_t landed = 0;
  while (landed < kWriteBytes && region_[landed] == payload[landed]) ++landed;
  EXPECT_LE(landed, trickled.load());
  EXPECT_FALSE(find_pattern_mismatch(std::span(region_).subspan(landed), kRegionSeed, landed))
      << "bytes beyond the trickled prefix changed";

  // The listener goes on serving: the region registered again takes a whole transfer.
  ASSERT_TRUE(target_->register_memory(region_.data(), region_.size()).ok());
  expect_transfer_lands(kTransferSeed);
}

// Before authentication a receiver with a secret reads a header, then at most a proof: a
// kHello that claims a payload is not read on (its bytes would be taken as frames) but
// closed without an answer.
TEST(TcpPreAuthentication, AHelloClaimingAPayloadIsClosedUnanswered) {
  EngineOptions options;
  options.name = "preauth-target";
  options.secret = "pre-auth secret";
  auto target = must(TransferEngine::create(options));
  const Endpoint tcp = must(fetch_tcp_endpoint(target->endpoint(), options.secret));
  RawTcpClient client = must(RawTcpClient::connect(tcp));
  TcpHeader hello;
  hello.type = TcpFrame::kHello;
  hello.length = kTcpMaxFrameBytes;
  client.send(hello);
  std::string what;
  EXPECT_TRUE(client.closed_by_peer(what, 2s)) << what;
  // A well-formed hello is answered with the nonce the proof is made from.
  RawTcpClient honest = must(RawTcpClient::connect(tcp));
  ASSERT_TRUE(honest.hello().ok());
  EXPECT_EQ(honest.nonce().size(), kTcpNonceBytes);
}

}  // namespace
}  // namespace kvferry::testing
