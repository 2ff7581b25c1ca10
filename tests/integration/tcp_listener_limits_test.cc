// The tcp data receiver's limits against clients that hold resources without using them:
// connections that never finish their hello or go idle are closed; a peer that floods
// requests without reading the replies stops being read (memory stays bounded) and is
// closed; a write whose payload never comes releases its region (unregister succeeds). A
// legitimate engine's transfer, every byte verified, succeeds meanwhile, and afterwards the
// descriptors and memory this process holds return to where they were.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "core/pattern.h"
#include "hostile_clients.h"
#include "raw_tcp_client.h"
#include "serve_client.h"
#include "test_support.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;

constexpr uint64_t kRegionBytes = 1ull << 20;
constexpr size_t kFdSlack = 8;
constexpr uint64_t kRssSlackBytes = uint64_t{64} << 20;

class TcpListenerLimits : public ::testing::Test {
 protected:
  void start_target(const EngineOptions& base) {
    EngineOptions options = base;
    options.name = "tcp-limits-target";
    target_ = must(TransferEngine::create(options));
    region_.resize(kRegionBytes);
    ASSERT_TRUE(target_->register_memory(region_.data(), region_.size()).ok());
    tcp_endpoint_ = must(fetch_tcp_endpoint(target_->endpoint()));
    EngineOptions initiator;
    initiator.name = "tcp-limits-initiator";
    initiator.forced_transport = TransportKind::kTcp;
    initiator_ = must(TransferEngine::create(initiator));
    source_.resize(kRegionBytes);
    ASSERT_TRUE(initiator_->register_memory(source_.data(), source_.size()).ok());
    expect_transfer_lands(0);  // its lanes are open before anything is counted
  }

  // An engine forced onto tcp writes random bytes into the target's region; every byte
  // arrives.
  void expect_transfer_lands(uint64_t seed) {
    fill_pattern(source_, seed);
    PeerHandle peer = must(initiator_->open_peer(target_->endpoint()));
    std::vector<TransferOp> ops = {{OpKind::kWrite, reinterpret_cast<uint64_t>(source_.data()),
                                    reinterpret_cast<uint64_t>(region_.data()), kRegionBytes}};
    BatchHandle batch = must(initiator_->submit(peer, ops));
    BatchStatus done = initiator_->wait(batch, 5s);
    ASSERT_EQ(done.state, BatchState::kCompleted) << done.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch(region_, seed)) << "the transfer's bytes did not land";
  }

  std::unique_ptr<TransferEngine> target_;
  std::unique_ptr<TransferEngine> initiator_;
  std::vector<std::byte> region_;
  std::vector<std::byte> source_;
  Endpoint tcp_endpoint_;
};

TEST_F(TcpListenerLimits, ConnectionsThatNeverHelloOrGoIdleAreClosed) {
  EngineOptions options;
  options.tcp_limits.hello_timeout = 300ms;
  options.tcp_limits.idle_timeout = 600ms;
  start_target(options);
  const size_t fds_before = open_fd_count();
  {
    HostileCrowd silent(tcp_endpoint_, 300, 6);  // 50 per source
    ASSERT_EQ(silent.connected(), 300u);
    std::vector<RawTcpClient> idle;
    for (int i = 0; i < 20; ++i) {
      idle.push_back(must(RawTcpClient::connect(tcp_endpoint_)));
      ASSERT_TRUE(idle.back().hello().ok());
    }
    expect_transfer_lands(1);
    EXPECT_TRUE(eventually([&] { return silent.closed_by_server() == silent.connected(); }, 3s))
        << silent.closed_by_server() << " of 300 silent connections closed";
    for (RawTcpClient& c : idle) {
      std::string what;
      EXPECT_TRUE(c.closed_by_peer(what, 3s)) << what;
    }
  }
  EXPECT_TRUE(eventually([&] { return open_fd_count() <= fds_before + kFdSlack; }, 3s))
      << open_fd_count() << " descriptors open, " << fds_before << " before";
  expect_transfer_lands(2);  // an idle lane closed by the receiver is reopened on next use
}

// A receiver closes a connection idle past its idle timeout; a request its initiator sends as
// it does would be lost with the connection. The receiver announces its timeout in kHelloAck,
// and an initiator retires a lane idle for half of it before the lane takes another request:
// transfers after idle spells on both sides of the timeout all land.
TEST_F(TcpListenerLimits, TransfersAfterIdleSpellsAroundTheIdleTimeoutAllLand) {
  EngineOptions options;
  options.tcp_limits.idle_timeout = 300ms;
  start_target(options);
  RawTcpClient raw = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(raw.hello().ok());
  EXPECT_EQ(raw.hello_ack().addr, 300u) << "the idle timeout in ms";
  uint64_t seed = 1;
  for (int round = 0; round < 2; ++round) {
    for (const auto idle : {100ms, 149ms, 151ms, 290ms, 300ms, 310ms, 450ms}) {
      SCOPED_TRACE(::testing::Message() << "after " << idle.count() << " ms idle");
      std::this_thread::sleep_for(idle);  // the idle spell is this test's input
      expect_transfer_lands(seed++);
    }
  }
}

TEST_F(TcpListenerLimits, APeerThatDoesNotReadItsRepliesIsNotReadEither) {
  EngineOptions options;
  options.tcp_stall_timeout = 1s;
  start_target(options);
  const uint64_t rss_before = resident_bytes();
  const size_t fds_before = open_fd_count();
  RawTcpClient flood = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(flood.hello().ok());
  // Zero-length Reads, 1,024 to a send, never reading a reply: up to a million of them
  // (48 MB), until the receiver stops taking them for 300 ms.
  TcpHeader read;
  read.type = TcpFrame::kRead;
  read.addr = reinterpret_cast<uint64_t>(region_.data());
  std::vector<std::byte> block;
  for (int i = 0; i < 1024; ++i) {
    read.request_id = i;
    const std::vector<std::byte> frame = encode_frame(read);
    block.insert(block.end(), frame.begin(), frame.end());
  }
  uint64_t sent = 0;
  size_t at = 0;  // where in the block the stream stands: frames stay whole
  auto last_progress = Clock::now();
  while (sent < uint64_t{1024} * 1024 * kTcpHeaderBytes && Clock::now() - last_progress < 300ms) {
    const size_t n = send_now(flood.fd(), std::span(block).subspan(at));
    if (n != 0) last_progress = Clock::now();
    sent += n;
    at = (at + n) % block.size();
    if (n == 0) std::this_thread::sleep_for(1ms);
  }
  const uint64_t rss = resident_bytes();
  EXPECT_LT(rss, rss_before + kRssSlackBytes)
      << "resident " << (rss >> 20) << " MiB after " << sent / kTcpHeaderBytes << " requests";
  expect_transfer_lands(3);  // other connections are served meanwhile
  // Closed after tcp_stall_timeout without a reply taken (reading them would be progress).
  EXPECT_TRUE(eventually([&] { return closed_by_other_side(flood.fd()); }, 3s));
  EXPECT_TRUE(eventually([&] { return open_fd_count() <= fds_before + kFdSlack; }, 3s));
}

TEST_F(TcpListenerLimits, AWriteWithoutDeadlineWhosePayloadNeverComesReleasesItsRegion) {
  EngineOptions options;
  options.tcp_stall_timeout = 300ms;
  start_target(options);
  RawTcpClient stalled = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(stalled.hello().ok());
  TcpHeader write;
  write.type = TcpFrame::kWrite;
  write.request_id = 1;
  write.addr = reinterpret_cast<uint64_t>(region_.data());
  write.length = 4096;
  write.deadline_ns = 0;  // no deadline: only the stall limit can end it
  stalled.send(encode_frame(write, std::vector<std::byte>(100, std::byte{0xAB})));
  // Pinned while the payload may still come; released once it has stalled.
  Status unregistered;
  EXPECT_TRUE(eventually(
      [&] {
        unregistered = target_->unregister_memory(region_.data());
        return unregistered.ok();
      },
      3s))
      << unregistered.to_string();
  std::string what;
  EXPECT_TRUE(stalled.closed_by_peer(what, 1s)) << what;
}

// CPU time (user + system) of process `pid` so far, in clock ticks.
uint64_t cpu_ticks(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "pid (comm) "
  std::string field;
  uint64_t utime = 0;
  uint64_t stime = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {  // fields 14 and 15: utime, stime
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return utime + stime;
}

// A `kvferry serve` child limited to 128 descriptors, flooded with 200 idle tcp connections
// that stay open: it runs out of descriptors, backs off instead of spinning, closes the idle
// connections at their hello deadline, and a legitimate peer's write gets through while the
// crowd is still there.
TEST(TcpListenerUnderADescriptorLimit, IdleFloodNeitherSpinsNorLocksPeersOut) {
  constexpr uint64_t kBytes = 1ull << 20;
  cli::ServePeer peer = must(
      cli::start_serve_peer(KVFERRY_CLI_PATH, kBytes, {}, {"/usr/bin/prlimit", "--nofile=128"}));
  const Endpoint tcp = must(fetch_tcp_endpoint(peer.endpoint));
  HostileCrowd crowd(tcp, 200, 4);  // 50 per source, under the per-source limit
  ASSERT_EQ(crowd.connected(), 200u);
  const uint64_t ticks_before = cpu_ticks(peer.process.pid());
  std::this_thread::sleep_for(1s);
  const uint64_t ticks = cpu_ticks(peer.process.pid()) - ticks_before;
  EXPECT_LT(ticks, static_cast<uint64_t>(::sysconf(_SC_CLK_TCK)) / 2)
      << "the child used " << ticks << " ticks of CPU in one second";
  EngineOptions options;
  options.name = "descriptor-limit-initiator";
  options.handshake_timeout = 1s;
  auto engine = must(TransferEngine::create(options));
  std::vector<std::byte> source(kBytes);
  fill_pattern(source, 77);
  ASSERT_TRUE(engine->register_memory(source.data(), kBytes).ok());
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(source.data()), peer.addr, kBytes};
  // Attempts while the crowd holds its connections: the child's descriptors come free at
  // each hello deadline (2 s), so one of these gets through.
  Status last;
  bool written = false;
  for (int attempt = 0; attempt < 10 && !written; ++attempt) {
    PeerOptions tcp_only;
    tcp_only.transport = TransportKind::kTcp;
    auto handle = engine->open_peer(peer.endpoint, tcp_only);
    last = handle.ok() ? engine->transfer_sync(*handle, {&op, 1}) : handle.status();
    written = last.ok();
    if (!written) std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(written) << last.to_string();
  EXPECT_EQ(must(peer.process.ask(fmt::format("verify 77 0 {}", kBytes), 10s)), "ok");
}

}  // namespace
}  // namespace kvferry::testing
