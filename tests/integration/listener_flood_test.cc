// Connection floods against the listeners that serve one request per connection (the p2p
// handshake, the bootstrap HTTP server): an attacker in a child process holds more
// connections than the listener has places, from twenty source addresses, and reconnects
// each one as soon as it is closed. Legitimate clients, from other addresses and from one of
// the attacker's, are still served, each within its own short deadline; a decode's requests
// in flight finish although the bootstrap server is flooded or gone; and the log stays a few
// lines long. KVFERRY_FLOOD_SECONDS lengthens the flood (a manual measurement runs 20 s);
// KVFERRY_FLOOD_SOURCES changes how many addresses the attacker uses (1: only 127.0.0.2).
#include <gtest/gtest.h>
#include <poll.h>
#include <spdlog/sinks/base_sink.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <numeric>

#include "connection_flood.h"
#include "core/logging.h"
#include "hostile_clients.h"
#include "kvferry/pd/bootstrap.h"
#include "metadata/handshake.h"
#include "test_support.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;

constexpr auto kDefaultFlood = 5s;
constexpr auto kProbeDeadline = 1s;
constexpr size_t kProbes = 100;
constexpr size_t kHealthCalls = 40;
constexpr uint32_t kAttackerSources = 20;  // 127.0.0.2 .. 127.0.0.21
constexpr const char* kAttackerAddress = "127.0.0.2";
// Log lines (warn and above) a flood may cost: each throttled warning a line per interval.
constexpr size_t kMaxFloodLogLines = 40;

// Counts the lines logged at warn or above, from the moment it is installed.
class WarningCounter : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static WarningCounter& installed() {
    static const std::shared_ptr<WarningCounter> counter = [] {
      auto sink = std::make_shared<WarningCounter>();
      kvferry::log().sinks().push_back(sink);
      return sink;
    }();
    return *counter;
  }
  size_t lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (msg.level >= spdlog::level::warn) ++lines_;
  }
  void flush_() override {}

 private:
  size_t lines_ = 0;
};

// A connection from `source` to `to`, established before `deadline`; invalid otherwise.
Fd connect_before(const std::string& source, const Endpoint& to, Clock::time_point deadline) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fd;
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(to.port);
  ::inet_pton(AF_INET, to.host.c_str(), &remote.sin_addr);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0) return Fd();
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), sizeof(remote)) == 0) return fd;
  if (errno != EINPROGRESS) return Fd();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  pollfd writable{fd.get(), POLLOUT, 0};
  if (left.count() <= 0 || ::poll(&writable, 1, static_cast<int>(left.count())) != 1) return Fd();
  int error = 0;
  socklen_t len = sizeof(error);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) return Fd();
  return fd;
}

// A legitimate client: the descriptor the handshake server at `to` serves, asked for from
// `source`, all within kProbeDeadline; empty on any failure.
std::string probe_descriptor(const std::string& source, const Endpoint& to) {
  const auto deadline = Clock::now() + kProbeDeadline;
  Fd fd = connect_before(source, to, deadline);
  if (!fd.valid()) return {};
  std::byte header[kHandshakeHeaderBytes];
  encode_handshake_header({kHandshakeMagic, kHandshakeVersion, HandshakeFrame::kGetDescriptor, 0},
                          header);
  if (!send_all(fd.get(), header, deadline).ok()) return {};
  if (!recv_all(fd.get(), header, deadline).ok()) return {};
  auto reply = decode_handshake_header(header, size_t{1} << 20);
  if (!reply.ok() || reply->type != HandshakeFrame::kDescriptor) return {};
  std::string payload(reply->length, '\0');
  if (!recv_all(fd.get(), std::as_writable_bytes(std::span(payload)), deadline).ok()) return {};
  return payload;
}

// A descriptor-sized JSON document of random content, so that a reply is checked byte for byte.
std::string random_descriptor() {
  std::string hex;
  uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::getpid());
  for (int i = 0; i < 256; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    hex.push_back("0123456789abcdef"[x & 0xF]);
  }
  return R"({"name":"flood-target","nonce":")" + hex + R"("})";
}

struct ProbeResults {
  size_t served = 0;
  std::vector<double> latencies_ms;  // of the calls served
  void add(bool ok, Clock::duration took) {
    if (!ok) return;
    ++served;
    latencies_ms.push_back(std::chrono::duration<double, std::milli>(took).count());
  }
  double percentile(double p) {
    if (latencies_ms.empty()) return 0;
    std::sort(latencies_ms.begin(), latencies_ms.end());
    return latencies_ms[static_cast<size_t>(p * static_cast<double>(latencies_ms.size() - 1))];
  }
};

TEST(HandshakeListenerUnderAConnectionFlood, ServesPeersFromOtherAndFromTheAttackersAddress) {
  WarningCounter& warnings = WarningCounter::installed();
  const std::string descriptor = random_descriptor();
  const ListenerLimits limits;  // the defaults: 512 places, 64 per source
  auto server = must(HandshakeServer::start(
      {"127.0.0.1", 0}, [&] { return std::make_shared<const std::string>(descriptor); }, limits));
  const Endpoint endpoint = server->endpoint();
  ASSERT_EQ(probe_descriptor("127.0.0.1", endpoint), descriptor);
  const auto flood_for = flood_duration(kDefaultFlood);
  const size_t lines_before = warnings.lines();

  ProbeResults other, attackers;
  double attack_rate = 0;
  {
    FloodOptions options;
    options.sources = flood_sources(kAttackerSources);
    ConnectionFlood flood(endpoint, options);
    ASSERT_TRUE(flood.running());
    const uint32_t attacker_can_hold =
        std::min(limits.max_connections, options.sources * limits.max_connections_per_source);
    // The listener (or the attacker's share of it) is full and the attacker is being closed to make
    // room: under attack.
    ASSERT_TRUE(eventually(
        [&] {
          return server->open_connections() >= attacker_can_hold * 9 / 10 &&
                 server->evicted() > limits.max_connections;
        },
        10s))
        << server->open_connections() << " open, " << server->evicted() << " evicted, "
        << flood.opened() << " opened by the attacker";
    const auto start = Clock::now();
    const auto gap = std::chrono::duration_cast<std::chrono::milliseconds>(flood_for) / kProbes;
    for (size_t i = 0; i < kProbes; ++i) {
      const std::string source = "127.0.0." + std::to_string(30 + i % 10);
      auto t0 = Clock::now();
      const bool served = probe_descriptor(source, endpoint) == descriptor;
      other.add(served, Clock::now() - t0);
      t0 = Clock::now();
      const bool served_to_attackers_address =
          probe_descriptor(kAttackerAddress, endpoint) == descriptor;
      attackers.add(served_to_attackers_address, Clock::now() - t0);
      std::this_thread::sleep_until(start + gap * (i + 1));
    }
    ASSERT_TRUE(flood.running());
    flood.stop();
    attack_rate = flood.connections_per_second();
  }
  const size_t flood_lines = warnings.lines() - lines_before;
  std::printf(
      "handshake flood: %.0f connections/s for %lld s; other sources %zu/%zu served (p50 %.2f ms, "
      "p99 %.2f ms, max %.2f ms); attacker's address %zu/%zu (p50 %.2f ms, max %.2f ms); "
      "%zu warning lines\n",
      attack_rate, static_cast<long long>(flood_for.count()), other.served, kProbes,
      other.percentile(0.5), other.percentile(0.99), other.percentile(1.0), attackers.served,
      kProbes, attackers.percentile(0.5), attackers.percentile(1.0), flood_lines);
  EXPECT_GE(other.served, kProbes * 9 / 10);
  EXPECT_GE(attackers.served, kProbes / 2);
  EXPECT_LE(flood_lines, kMaxFloodLogLines);
  // Once the attacker is gone, the listener is empty again and serves at once.
  EXPECT_TRUE(eventually([&] { return server->open_connections() == 0; }));
  EXPECT_EQ(probe_descriptor("127.0.0.1", endpoint), descriptor);
}

// One prefill rank and one decode rank with a bootstrap server, and requests between them.
// The control links are patient (a flood on two cores starves them of CPU for a while); the
// bootstrap health check runs every heartbeat interval.
class BootstrapFlood : public ::testing::Test {
 protected:
  static constexpr uint32_t kPagesPerRoom = 4;

  static pd::PdTimeouts timeouts() {
    pd::PdTimeouts t = pd::testing::fast_timeouts();
    t.heartbeat_interval = 100ms;
    t.heartbeat_timeout = 3s;  // what the decode once allowed the bootstrap server, too
    t.bootstrap_timeout = 5s;
    t.waiting_timeout = 60s;
    return t;
  }

  void SetUp() override {
    bootstrap_ = must(pd::BootstrapServer::start({}));
    address_ = bootstrap_->address();
    prefill_ = pd::testing::make_prefill(p_, address_, false, timeouts());
    decode_ = pd::testing::make_decode(d_, timeouts());
  }

  struct Request {
    uint64_t room = 0;
    std::vector<kv::PageIndex> src, dst;
    pd::KvReceiver receiver;
    pd::KvSender sender;
  };

  // A request with its pages filled, both sides waiting for the prefill to send.
  void start_request(Request& r, uint64_t room) {
    r.room = room;
    const auto slot = static_cast<kv::PageIndex>(room % 4);
    r.src = pd::testing::pages_from(slot * kPagesPerRoom, kPagesPerRoom);
    r.dst = pd::testing::pages_from(16 + slot * kPagesPerRoom, kPagesPerRoom);
    pd::fill_request_pages(p_.buffers.layout, r.src, tokens(), room, p_.heads);
    r.receiver = must(decode_->create_receiver(address_, room));
    ASSERT_TRUE(r.receiver.init(r.dst).ok());
    r.sender = must(prefill_->create_sender(room));
  }

  void finish_and_verify(Request& r) {
    ASSERT_EQ(r.sender.wait_at_least(pd::RequestState::kWaitingForInput, 5s),
              pd::RequestState::kWaitingForInput)
        << r.sender.failure().to_string();
    pd::LastChunkExtras none;
    ASSERT_TRUE(r.sender.send(r.src, &none).ok());
    ASSERT_EQ(r.receiver.wait_final(10s), pd::RequestState::kSuccess)
        << "room " << r.room << ": " << r.receiver.failure().to_string();
    EXPECT_EQ(r.sender.wait_final(10s), pd::RequestState::kSuccess)
        << r.sender.failure().to_string();
    EXPECT_EQ(pd::count_corrupt_pages(d_.buffers.layout, r.dst, tokens(), r.room, d_.heads), 0u);
  }

  static uint64_t tokens() {
    return uint64_t{kPagesPerRoom} * pd::testing::ModelShape{}.page_tokens;
  }

  pd::testing::ModelShape m_;
  pd::testing::TestRank p_ = pd::testing::make_rank("prefill", m_, 1, 0);
  pd::testing::TestRank d_ = pd::testing::make_rank("decode", m_, 1, 0);
  std::unique_ptr<pd::BootstrapServer> bootstrap_;
  std::string address_;
  std::unique_ptr<pd::PrefillServer> prefill_;
  std::unique_ptr<pd::DecodeClient> decode_;
};

TEST_F(BootstrapFlood, ConnectionFloodOnBootstrapFailsNoRequestInFlight) {
  WarningCounter& warnings = WarningCounter::installed();
  std::vector<Request> in_flight(3);
  for (size_t i = 0; i < in_flight.size(); ++i) start_request(in_flight[i], 1 + i);
  for (auto& r : in_flight) {
    ASSERT_EQ(r.receiver.wait_at_least(pd::RequestState::kTransferring, 5s),
              pd::RequestState::kTransferring);
  }
  const std::chrono::milliseconds flood_for = std::max<std::chrono::milliseconds>(
      flood_duration(kDefaultFlood), timeouts().heartbeat_timeout * 2);
  const size_t lines_before = warnings.lines();
  double attack_rate = 0;
  Clock::time_point flood_end;
  ProbeResults health;
  {
    FloodOptions options;
    options.sources = flood_sources(kAttackerSources);
    ConnectionFlood flood(must(parse_endpoint(address_)), options);
    ASSERT_TRUE(flood.running());
    ASSERT_TRUE(eventually([&] { return flood.opened() > 4 * options.sockets; }, 10s))
        << flood.opened() << " connections opened by the attacker";
    // Meanwhile a client asks for /health, each call within its own 1 s.
    pd::BootstrapClient client(address_, kProbeDeadline);
    const auto start = Clock::now();
    for (size_t i = 0; i < kHealthCalls; ++i) {
      const auto t0 = Clock::now();
      Result<pd::HealthReport> report = client.health();
      health.add(report.ok() && report->healthy, Clock::now() - t0);
      std::this_thread::sleep_until(start + flood_for * (i + 1) / kHealthCalls);
    }
    // Longer than the decode once let the bootstrap server stay silent: nothing failed.
    for (auto& r : in_flight) {
      EXPECT_EQ(r.receiver.poll(), pd::RequestState::kTransferring)
          << "room " << r.room << ": " << r.receiver.failure().to_string();
    }
    for (auto& r : in_flight) finish_and_verify(r);
    ASSERT_TRUE(flood.running());
    flood.stop();
    flood_end = Clock::now();
    attack_rate = flood.connections_per_second();
  }
  // A new request starts (its destination went to the prefill) within 2 s of the flood's end.
  Request next;
  start_request(next, 8);
  EXPECT_EQ(next.receiver.wait_at_least(pd::RequestState::kTransferring, 2s),
            pd::RequestState::kTransferring);
  const auto started_after = Clock::now() - flood_end;
  finish_and_verify(next);
  const size_t flood_lines = warnings.lines() - lines_before;
  std::printf(
      "bootstrap flood: %.0f connections/s for %lld s; /health %zu/%zu answered (p50 %.2f ms, "
      "max %.2f ms); %zu requests in flight succeeded; a new one started %.0f ms after the "
      "flood; %zu warning lines\n",
      attack_rate, static_cast<long long>(flood_for.count() / 1000), health.served, kHealthCalls,
      health.percentile(0.5), health.percentile(1.0), in_flight.size(),
      std::chrono::duration<double, std::milli>(started_after).count(), flood_lines);
  EXPECT_LT(started_after, 2s);
  EXPECT_GE(health.served, kHealthCalls * 9 / 10);
  EXPECT_LE(flood_lines, kMaxFloodLogLines);
}

TEST_F(BootstrapFlood, UnreachableBootstrapFailsNoRequestInFlight) {
  std::vector<Request> in_flight(2);
  for (size_t i = 0; i < in_flight.size(); ++i) start_request(in_flight[i], 1 + i);
  for (auto& r : in_flight) {
    ASSERT_EQ(r.receiver.wait_at_least(pd::RequestState::kTransferring, 5s),
              pd::RequestState::kTransferring);
  }
  bootstrap_->stop();  // refuses connections from now on: every health check fails
  std::this_thread::sleep_for(timeouts().heartbeat_timeout * 3 / 2);
  for (auto& r : in_flight) {
    EXPECT_EQ(r.receiver.poll(), pd::RequestState::kTransferring)
        << "room " << r.room << ": " << r.receiver.failure().to_string();
  }
  for (auto& r : in_flight) finish_and_verify(r);
}

}  // namespace
}  // namespace kvferry::testing
