// Slow, idle and greedy clients against the listeners that serve one request per
// connection (the p2p handshake, the bootstrap HTTP server) and the PD control listener,
// whose deadlines also hold while the bootstrap server it registers with falls silent.
// The crowd comes from other loopback addresses (127.0.0.2 and up); the legitimate client
// from 127.0.0.1 is served while it waits — each of its calls has its own short timeout, so
// a listener that serves connections one after another fails the call. Afterwards the
// descriptors and memory this process holds return to where they were.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstring>
#include <span>
#include <thread>

#include "hostile_clients.h"
#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/prefill_server.h"
#include "metadata/handshake.h"
#include "test_support.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;

constexpr size_t kSlowClients = 50;
constexpr size_t kIdleClients = 400;
constexpr size_t kCrowdSources = 10;  // 45 connections per source, under the default 64
// What a crowd that has dispersed may leave behind in this process.
constexpr size_t kFdSlack = 8;
constexpr uint64_t kRssSlackBytes = uint64_t{32} << 20;

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto* p = reinterpret_cast<const std::byte*>(text.data());
  return {p, p + text.size()};
}

TEST(HandshakeListener, SlowAndIdleClientsDoNotDelayOthers) {
  auto target = make_engine("handshake-target");
  const Endpoint endpoint = must(parse_endpoint(target->endpoint()));
  const size_t fds_before = open_fd_count();
  const uint64_t rss_before = resident_bytes();
  {
    // Half a frame header each, the rest never comes; and connections that send nothing.
    std::vector<std::byte> half_header(kHandshakeHeaderBytes / 2, std::byte{0x4B});
    HostileCrowd slow(endpoint, kSlowClients, kCrowdSources, half_header);
    HostileCrowd idle(endpoint, kIdleClients, kCrowdSources);
    ASSERT_EQ(slow.connected() + idle.connected(), kSlowClients + kIdleClients);
    // 13 descriptor fetches, each allowed 500 ms (a FIFO server with 2 threads and 2 s per
    // connection fails nearly all of them), then a peer opened by an engine and written to.
    for (int i = 0; i < 13; ++i) {
      auto json = fetch_descriptor(endpoint, Clock::now() + 500ms);
      ASSERT_TRUE(json.ok()) << "fetch " << i << ": " << json.status().to_string();
    }
    EngineOptions options;
    options.name = "handshake-initiator";
    options.handshake_timeout = 500ms;
    auto initiator = must(TransferEngine::create(options));
    EXPECT_TRUE(initiator->open_peer(target->endpoint()).ok());
    // The server closes whoever did not finish within hello_timeout (2 s by default).
    EXPECT_TRUE(eventually([&] { return idle.closed_by_server() == idle.connected(); }))
        << idle.closed_by_server() << " of " << idle.connected() << " idle connections closed";
    EXPECT_EQ(slow.closed_by_server(), slow.connected());
  }
  EXPECT_TRUE(eventually([&] { return open_fd_count() <= fds_before + kFdSlack; }))
      << open_fd_count() << " descriptors open, " << fds_before << " before";
  EXPECT_LT(resident_bytes(), rss_before + kRssSlackBytes);
}

TEST(HandshakeListener, ConnectionsOverTheSourceLimitAreClosedAtOnce) {
  EngineOptions options;
  options.name = "handshake-limited";
  options.handshake_limits.max_connections_per_source = 8;
  options.handshake_limits.hello_timeout = 10s;  // only the limit may close them here
  auto target = must(TransferEngine::create(options));
  const Endpoint endpoint = must(parse_endpoint(target->endpoint()));
  HostileCrowd crowd(endpoint, 20, 1);  // all from 127.0.0.2
  ASSERT_EQ(crowd.connected(), 20u);
  EXPECT_TRUE(eventually([&] { return crowd.closed_by_server() == 12; }, 2s))
      << crowd.closed_by_server() << " of 20 closed; the limit is 8 per source";
  EXPECT_TRUE(fetch_descriptor(endpoint, Clock::now() + 500ms).ok());  // from 127.0.0.1
}

TEST(BootstrapListener, SlowAndIdleClientsDoNotDelayHealth) {
  auto server = must(pd::BootstrapServer::start({}));
  const Endpoint endpoint = must(parse_endpoint(server->address()));
  pd::BootstrapClient client(server->address(), 500ms);
  pd::RankRegistration rank;
  rank.control_endpoint = "127.0.0.1:1";
  rank.engine_endpoint = "127.0.0.1:2";
  rank.page_size_tokens = 16;
  rank.dtype_bytes = 2;
  ASSERT_TRUE(client.register_rank(rank).ok());
  const size_t fds_before = open_fd_count();
  const uint64_t rss_before = resident_bytes();
  {
    const std::vector<std::byte> head_start = bytes_of("GET /health HTTP/1.1\r\nHost: x\r\n");
    HostileCrowd slow(endpoint, 20, kCrowdSources, head_start);
    // Within the listener's 256 places, so that hello_timeout closes every one of them (a
    // crowd beyond them has its oldest idle connections closed to admit newcomers:
    // listener_flood_test.cc).
    HostileCrowd idle(endpoint, 200, kCrowdSources);
    ASSERT_EQ(slow.connected() + idle.connected(), 220u);
    for (int i = 0; i < 6; ++i) {
      auto health = client.health();
      ASSERT_TRUE(health.ok()) << "health " << i << ": " << health.status().to_string();
      EXPECT_TRUE(health->healthy);
    }
    // A request that arrives in pieces, but within the deadline, is answered.
    Fd piecewise = connect_from("127.0.0.1", endpoint);
    const std::string request = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    for (size_t at = 0; at < request.size(); at += 16) {
      send_now(piecewise.get(), bytes_of(request.substr(at, 16)));
      std::this_thread::sleep_for(20ms);
    }
    std::string answer(12, '\0');
    ASSERT_TRUE(
        recv_all(piecewise.get(), std::as_writable_bytes(std::span(answer)), Clock::now() + 1s)
            .ok());
    EXPECT_EQ(answer, "HTTP/1.1 200");
    EXPECT_TRUE(eventually([&] { return idle.closed_by_server() == idle.connected(); }));
  }
  EXPECT_TRUE(eventually([&] { return open_fd_count() <= fds_before + kFdSlack; }))
      << open_fd_count() << " descriptors open, " << fds_before << " before";
  EXPECT_LT(resident_bytes(), rss_before + kRssSlackBytes);
}

// Sends `request` from 127.0.0.1 and reads the answer until the server closes (1 s at most).
std::string answer_to(const Endpoint& server, const std::string& request) {
  Fd fd = connect_from("127.0.0.1", server);
  send_all(fd.get(), bytes_of(request), Clock::now() + 1s).ignore();
  std::string answer;
  const auto deadline = Clock::now() + 1s;
  while (Clock::now() < deadline) {
    char chunk[4096];
    ssize_t n = ::recv(fd.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;
    if (n > 0) answer.append(chunk, static_cast<size_t>(n));
    if (n < 0) std::this_thread::sleep_for(5ms);
  }
  return answer;
}

TEST(BootstrapListener, RefusesWhatItCannotFrameNamingItAndKeepsServing) {
  auto server = must(pd::BootstrapServer::start({}));
  const Endpoint endpoint = must(parse_endpoint(server->address()));
  const std::string chunked = answer_to(endpoint,
                                        "PUT /register HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                                        "chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
  EXPECT_EQ(chunked.substr(0, 12), "HTTP/1.1 411") << chunked;
  EXPECT_TRUE(contains(chunked, "Transfer-Encoding 'chunked'")) << chunked;
  // A head that never ends within 16 KiB, sent whole: refused, and the refusal arrives.
  const std::string endless_head =
      answer_to(endpoint, "GET /health HTTP/1.1\r\nX-Pad: " + std::string(24 << 10, 'a'));
  EXPECT_EQ(endless_head.substr(0, 12), "HTTP/1.1 431") << endless_head.substr(0, 200);
  const std::string big_body =
      answer_to(endpoint, "PUT /register HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{");
  EXPECT_EQ(big_body.substr(0, 12), "HTTP/1.1 413") << big_body;
  EXPECT_TRUE(contains(big_body, "1000000 bytes")) << big_body;
  const std::string health =
      answer_to(endpoint, "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(health.substr(0, 12), "HTTP/1.1 503") << health;  // no rank registered yet
}

// A PD control header claiming a 16 MiB payload, then a few bytes of it.
std::vector<std::byte> greedy_control_frame() {
  std::vector<std::byte> frame(pd::kFrameHeaderBytes + 16);
  const uint32_t magic = pd::kControlMagic;
  const uint16_t version = pd::kControlVersion;
  const auto type = static_cast<uint16_t>(pd::MessageType::kRegisterLayout);
  const uint32_t length = (uint32_t{16} << 20) - 1;
  std::memcpy(frame.data(), &magic, 4);  // little-endian, like the protocol
  std::memcpy(frame.data() + 4, &version, 2);
  std::memcpy(frame.data() + 6, &type, 2);
  std::memcpy(frame.data() + 8, &length, 4);
  return frame;
}

TEST(ControlListener, LengthClaimsCostNothingAndConnectionsAreBounded) {
  pd::testing::ModelShape shape;
  pd::testing::TestRank rank = pd::testing::make_rank("control-target", shape, 1, 0);
  pd::PrefillServerOptions o = pd::testing::prefill_options(rank, "", pd::PdTimeouts{});
  o.control_limits.max_connections = 48;
  o.control_limits.max_connections_per_source = 8;  // the crowd gets 40 places, others 8
  o.control_limits.hello_timeout = 1s;
  auto prefill = must(pd::PrefillServer::create(std::move(o)));
  const Endpoint endpoint = must(parse_endpoint(prefill->control_endpoint()));
  const uint64_t threads_before = thread_count();
  const uint64_t rss_before = resident_bytes();
  const size_t fds_before = open_fd_count();
  {
    HostileCrowd greedy(endpoint, 150, 5, greedy_control_frame());  // 30 per source
    ASSERT_EQ(greedy.connected(), 150u);
    std::this_thread::sleep_for(300ms);  // time to allocate, had the server sized buffers
    const uint64_t rss = resident_bytes();
    const uint64_t threads = thread_count();
    EXPECT_LT(rss, rss_before + kRssSlackBytes) << "resident " << (rss >> 20) << " MiB";
    // Two threads per connection (reader, heartbeat), at most max_connections of them.
    EXPECT_LE(threads, threads_before + 2 * 48)
        << threads << " threads, " << threads_before << " before";
    // The server still answers a legitimate client: a request before the layout is refused.
    Fd fd = connect_from("127.0.0.1", endpoint);
    pd::TransferRequest early;
    early.room = 7;
    early.dst_pages = {1};
    ASSERT_TRUE(send_all(fd.get(), pd::encode_control_message(early), Clock::now() + 1s).ok());
    std::vector<std::byte> reply(pd::kFrameHeaderBytes);
    ASSERT_TRUE(recv_all(fd.get(), reply, Clock::now() + 1s).ok());
    pd::FrameHeader h = must(pd::decode_frame_header(reply));
    // Every connection opens with prefill's AuthChallenge (empty without a secret).
    ASSERT_EQ(h.type, pd::MessageType::kAuthChallenge);
    std::vector<std::byte> challenge(h.payload_bytes);
    ASSERT_TRUE(recv_all(fd.get(), challenge, Clock::now() + 1s).ok());
    ASSERT_TRUE(recv_all(fd.get(), reply, Clock::now() + 1s).ok());
    h = must(pd::decode_frame_header(reply));
    EXPECT_EQ(h.type, pd::MessageType::kRequestStatus);
    // Connections that never register are closed (hello_timeout, or the heartbeat timeout).
    EXPECT_TRUE(eventually([&] { return greedy.closed_by_server() == greedy.connected(); }));
  }
  EXPECT_TRUE(eventually([&] { return thread_count() <= threads_before + 2; }))
      << thread_count() << " threads, " << threads_before << " before";
  EXPECT_TRUE(eventually([&] { return open_fd_count() <= fds_before + kFdSlack; }));
  EXPECT_TRUE(eventually([&] { return prefill->stats().decode_connections == 0; }));
}

TEST(ControlListener, AConnectionThatNeverRegistersIsClosed) {
  pd::testing::ModelShape shape;
  pd::testing::TestRank rank = pd::testing::make_rank("control-unregistered", shape, 1, 0);
  pd::PrefillServerOptions o = pd::testing::prefill_options(rank, "", pd::PdTimeouts{});
  o.timeouts.heartbeat_interval = 200ms;
  o.control_limits.hello_timeout = 500ms;
  auto prefill = must(pd::PrefillServer::create(std::move(o)));
  const Endpoint endpoint = must(parse_endpoint(prefill->control_endpoint()));
  // It keeps the channel alive with heartbeats, so only the registration deadline can end it.
  Fd fd = connect_from("127.0.0.2", endpoint);
  const auto until = Clock::now() + 3s;
  bool closed = false;
  for (uint64_t seq = 0; Clock::now() < until && !closed; ++seq) {
    closed =
        !send_all(fd.get(), pd::encode_control_message(pd::Heartbeat{seq, 1}), Clock::now() + 1s)
             .ok();
    std::byte drain[256];
    ssize_t n = ::recv(fd.get(), drain, sizeof(drain), MSG_DONTWAIT);
    while (n > 0) n = ::recv(fd.get(), drain, sizeof(drain), MSG_DONTWAIT);
    closed = closed || n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(closed) << "a connection that only sends heartbeats is still open after 3 s";
}

// A bootstrap server that answers a rank's first registration and then falls silent: it
// reads each later request and holds its connection, unanswered, until the rank gives up on
// it (closes it) or the stand-in stops.
class BootstrapSilentAfterFirst {
 public:
  BootstrapSilentAfterFirst() {
    listener_ = must(listen_tcp(Endpoint{"127.0.0.1", 0}, &bound_));
    thread_ = std::thread([this] { run(); });
  }
  ~BootstrapSilentAfterFirst() { stop(); }
  // Closes the connections it holds: a registration still waiting on one ends at once.
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::string address() const { return bound_.to_string(); }
  // Registrations received and left unanswered; of those, the ones their client gave up on.
  int held() const { return held_.load(); }
  int given_up() const { return given_up_.load(); }

 private:
  void run() {
    std::vector<Fd> held;  // closed (invalid) once their client gave up
    while (!stop_) {
      std::vector<pollfd> fds{{listener_.get(), POLLIN, 0}};
      for (const Fd& fd : held) fds.push_back({fd.valid() ? fd.get() : -1, POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        std::array<char, 4096> drain{};
        const ssize_t n = ::recv(held[i - 1].get(), drain.data(), drain.size(), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
          held[i - 1].reset();
          given_up_.fetch_add(1);
        }
      }
      if ((fds[0].revents & POLLIN) == 0) continue;
      Fd client(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!client.valid()) continue;
      if (answered_) {
        held.push_back(std::move(client));
        held_.fetch_add(1);
        continue;
      }
      answered_ = answer(client.get());
    }
  }
  // Reads one request whole (head, then Content-Length bytes) and answers 200 with "{}".
  static bool answer(int fd) {
    const auto deadline = Clock::now() + 5s;
    std::string request;
    size_t head_end = std::string::npos;
    size_t body_bytes = 0;
    while (Clock::now() < deadline) {
      std::array<char, 4096> chunk{};
      const ssize_t n = ::recv(fd, chunk.data(), chunk.size(), 0);
      if (n <= 0) return false;
      request.append(chunk.data(), static_cast<size_t>(n));
      if (head_end == std::string::npos) {
        head_end = request.find("\r\n\r\n");
        if (head_end == std::string::npos) continue;
        const size_t at = request.find("Content-Length: ");
        if (at != std::string::npos && at < head_end)
          body_bytes = std::stoul(request.substr(at + 16));
      }
      if (request.size() >= head_end + 4 + body_bytes) break;
    }
    constexpr std::string_view kReply =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        "Connection: close\r\n\r\n{}";
    return send_all(fd, std::as_bytes(std::span(kReply)), deadline).ok();
  }

  Fd listener_;
  Endpoint bound_;
  bool answered_ = false;
  std::atomic<bool> stop_{false};
  std::atomic<int> held_{0};
  std::atomic<int> given_up_{0};
  std::thread thread_;
};

// A connection that never registers is closed at its deadline while the rank's registration
// with a silent bootstrap server is under way: that call waits out its own timeout (here the
// heartbeat interval, 3 s) on a thread of its own, not on the thread that keeps the deadlines.
TEST(ControlListener, AConnectionThatNeverRegistersIsClosedWhileTheBootstrapServerIsSilent) {
  BootstrapSilentAfterFirst bootstrap;
  pd::testing::ModelShape shape;
  pd::testing::TestRank rank = pd::testing::make_rank("control-silent-bootstrap", shape, 1, 0);
  pd::PdTimeouts timeouts;
  timeouts.heartbeat_interval = 3s;
  pd::PrefillServerOptions o = pd::testing::prefill_options(rank, bootstrap.address(), timeouts);
  o.control_limits.hello_timeout = 200ms;
  auto prefill = must(pd::PrefillServer::create(std::move(o)));
  // The heartbeat's registration, unanswered.
  ASSERT_TRUE(eventually([&] { return bootstrap.held() == 1; }, 10s));
  const Endpoint endpoint = must(parse_endpoint(prefill->control_endpoint()));
  Fd fd = connect_from("127.0.0.2", endpoint);
  bool closed = false;
  eventually(
      [&] {
        std::array<std::byte, 256> drain{};
        ssize_t n = ::recv(fd.get(), drain.data(), drain.size(), MSG_DONTWAIT);
        while (n > 0) n = ::recv(fd.get(), drain.data(), drain.size(), MSG_DONTWAIT);
        closed = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
        return closed || bootstrap.given_up() > 0;
      },
      10s);
  EXPECT_TRUE(closed) << "a connection that never registered is still open after 10 s";
  EXPECT_EQ(bootstrap.given_up(), 0)
      << "the connection was closed only after the registration under way timed out";
  bootstrap.stop();
}

}  // namespace
}  // namespace kvferry::testing
