// Unauthenticated clients on a prefill's PD control port whose first frames claim, and send,
// 16 MiB. Until a connection has proved the secret (or, without one, registered) its frames are
// capped at the largest it may legitimately send next, so 256 of them raise the resident memory
// of the process hosting the prefill by a few megabytes, that memory is returned once they are
// gone, and a legitimate decode's request alongside moves every page intact. The crowd comes
// from other loopback addresses (127.0.0.2 and up).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/frame_header.h"
#include "core/pattern.h"
#include "hostile_clients.h"
#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/decode_client.h"
#include "pd/control_auth.h"
#include "pd/page_pattern.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;
using pd::testing::ModelShape;
using pd::testing::TestRank;

constexpr size_t kGreedyClients = 256;
constexpr size_t kGreedySources = 8;  // 32 connections per source
constexpr uint64_t kMaxPeakRiseBytes = uint64_t{64} << 20;
// What the flood may leave resident once it is gone: allocator and thread-stack caches.
constexpr uint64_t kRetainedSlackBytes = uint64_t{4} << 20;
constexpr auto kFloodDeadline = 30s;

// Resident bytes of this process, counted page by page (smaps_rollup), not from the kernel's
// approximate counters.
uint64_t resident_pages_bytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(rollup, line)) {
    if (line.rfind("Rss:", 0) == 0) return std::stoull(line.substr(4)) * 1024;
  }
  return 0;
}

// Resident bytes once they are at most `limit`, or after 5 s.
uint64_t settled_resident_bytes(uint64_t limit) {
  uint64_t resident = 0;
  eventually([&] {
    resident = resident_pages_bytes();
    return resident <= limit;
  });
  return resident;
}

// The largest resident size this process had while it ran, sampled every 2 ms.
class PeakResidentSampler {
 public:
  PeakResidentSampler()
      : thread_([this] {
          while (!stop_) {
            peak_ = std::max<uint64_t>(peak_, resident_pages_bytes());
            std::this_thread::sleep_for(2ms);
          }
        }) {}
  ~PeakResidentSampler() { stop(); }
  uint64_t stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return peak_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> peak_{0};
  std::thread thread_;
};

// Connections from 127.0.0.2 .. 127.0.0.(1 + sources) that each send a control frame header
// claiming `claimed_bytes`, then as much of `payload` as the server takes.
class GreedyClients {
 public:
  GreedyClients(const Endpoint& to, size_t connections, size_t sources, pd::MessageType type,
                uint32_t claimed_bytes) {
    std::byte header[kFrameHeaderBytes];
    encode_frame_header(FrameHeader{pd::kControlMagic, pd::kControlVersion,
                                    static_cast<uint16_t>(type), claimed_bytes},
                        header);
    for (size_t i = 0; i < connections; ++i) {
      Fd fd = connect_from("127.0.0." + std::to_string(2 + i % sources), to);
      if (!fd.valid()) continue;
      send_now(fd.get(), header);
      clients_.push_back({std::move(fd), 0, false});
    }
  }
  size_t connected() const { return clients_.size(); }

  // Sends `payload` on every connection without waiting on any, until each has sent all of
  // it or was closed by the server, or `deadline`.
  void pump(std::span<const std::byte> payload, Clock::time_point deadline) {
    for (bool busy = true; busy && Clock::now() < deadline;) {
      busy = false;
      bool progressed = false;
      for (Client& c : clients_) {
        if (c.refused || c.sent == payload.size()) continue;
        ssize_t n = ::send(c.fd.get(), payload.data() + c.sent, payload.size() - c.sent,
                           MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n > 0) {
          c.sent += static_cast<size_t>(n);
          progressed = true;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          c.refused = true;
        } else if (closed_by_other_side(c.fd.get())) {
          c.refused = true;
        }
        busy = busy || (!c.refused && c.sent < payload.size());
      }
      if (!progressed) std::this_thread::sleep_for(1ms);
    }
  }
  // Connections the server closed before taking the whole payload.
  size_t refused() const {
    return static_cast<size_t>(
        std::count_if(clients_.begin(), clients_.end(), [](const Client& c) { return c.refused; }));
  }
  // Bytes the clients wrote that the server's kernel has not yet acknowledged (SIOCOUTQ):
  // what the prefill has still to read, or to take in its socket buffer.
  uint64_t unacknowledged() const {
    uint64_t total = 0;
    for (const Client& c : clients_) {
      int queued = 0;
      if (::ioctl(c.fd.get(), SIOCOUTQ, &queued) == 0) total += static_cast<uint64_t>(queued);
    }
    return total;
  }
  uint64_t most_sent() const {
    uint64_t most = 0;
    for (const Client& c : clients_) most = std::max<uint64_t>(most, c.sent);
    return most;
  }
  void disperse() { clients_.clear(); }

 private:
  struct Client {
    Fd fd;
    size_t sent = 0;
    bool refused = false;
  };
  std::vector<Client> clients_;
};

// Prefill and decode (with `secret`, or none) behind one bootstrap server; heartbeats that a
// machine busy with the flood cannot miss.
struct PdPair {
  explicit PdPair(const std::optional<std::string>& secret)
      : bootstrap(must(pd::BootstrapServer::start(bootstrap_options(secret)))),
        p(pd::testing::make_rank("prefill", m, 1, 0, secret)),
        d(pd::testing::make_rank("decode", m, 1, 0, secret)) {
    pd::PrefillServerOptions o = pd::testing::prefill_options(p, bootstrap->address(), timeouts());
    o.control_limits.max_connections = 2 * kGreedyClients;  // the decode's place is not the point
    o.control_limits.max_connections_per_source = 64;
    // Only the cap or the client ends a connection here (longer than any wait of the tests).
    o.control_limits.hello_timeout = 2 * kFloodDeadline;
    prefill = must(pd::PrefillServer::create(std::move(o)));
    decode = pd::testing::make_decode(d, timeouts());
  }
  static pd::BootstrapServerOptions bootstrap_options(const std::optional<std::string>& secret) {
    pd::BootstrapServerOptions o;
    o.secret = secret;
    return o;
  }
  static pd::PdTimeouts timeouts() {
    pd::PdTimeouts t = pd::testing::fast_timeouts();
    t.heartbeat_interval = 200ms;
    // Longer than any wait of the tests: a held connection, which sends no whole frame, is
    // closed as silent after it, and a busy machine must not miss a heartbeat either.
    t.heartbeat_timeout = 2 * kFloodDeadline;
    return t;
  }
  // One request of six pages, every page checked where it arrived.
  void transfer_and_verify(uint64_t room) {
    const std::vector<kv::PageIndex> src = pd::testing::pages_from(2, 6);
    const std::vector<kv::PageIndex> dst = pd::testing::pages_from(12, 6);
    const uint64_t tokens = 6 * m.page_tokens;
    pd::fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
    pd::KvReceiver receiver = must(decode->create_receiver(bootstrap->address(), room));
    ASSERT_TRUE(receiver.init(dst).ok());
    pd::KvSender sender = must(prefill->create_sender(room));
    ASSERT_EQ(sender.wait_at_least(pd::RequestState::kWaitingForInput, 10s),
              pd::RequestState::kWaitingForInput)
        << sender.failure().to_string();
    pd::LastChunkExtras none;
    ASSERT_TRUE(sender.send(src, &none).ok());
    ASSERT_EQ(receiver.wait_final(10s), pd::RequestState::kSuccess)
        << receiver.failure().to_string();
    EXPECT_EQ(sender.wait_final(10s), pd::RequestState::kSuccess) << sender.failure().to_string();
    EXPECT_EQ(pd::count_corrupt_pages(d.buffers.layout, dst, tokens, room, d.heads), 0u);
  }

  ModelShape m;
  std::unique_ptr<pd::BootstrapServer> bootstrap;
  TestRank p, d;
  std::unique_ptr<pd::PrefillServer> prefill;
  std::unique_ptr<pd::DecodeClient> decode;
};

// 256 connections claiming and sending 16 MiB first frames while a legitimate request runs.
// The attackers gone: the prefill keeps only the decode's connection, no extra thread, and
// what their buffers took goes back to the system. Returns the resident bytes after.
uint64_t expect_nothing_stays(PdPair& pair, GreedyClients& greedy, uint64_t rss_before,
                              uint64_t threads_before) {
  greedy.disperse();
  EXPECT_TRUE(eventually([&] { return pair.prefill->stats().decode_connections == 1; }))
      << pair.prefill->stats().decode_connections << " decode connections";
  EXPECT_TRUE(eventually([&] { return thread_count() <= threads_before + 2; }))
      << thread_count() << " threads, " << threads_before << " before";
  const uint64_t rss_after = settled_resident_bytes(rss_before + kRetainedSlackBytes);
  EXPECT_LE(rss_after, rss_before + kRetainedSlackBytes)
      << "resident " << (rss_after >> 20) << " MiB after, " << (rss_before >> 20) << " before";
  return rss_after;
}

void flood_first_frames(const std::optional<std::string>& secret) {
  PdPair pair(secret);
  pair.transfer_and_verify(1);  // the decode's link and the engines' peers exist before
  ASSERT_EQ(pair.prefill->stats().decode_connections, 1u);
  std::vector<std::byte> payload(pd::kMaxControlPayloadBytes);
  fill_pattern(payload, 17);  // resident before the baseline: the attacker's, not the prefill's
  const Endpoint endpoint = must(parse_endpoint(pair.prefill->control_endpoint()));
  const uint64_t threads_before = thread_count();
  const uint64_t rss_before = resident_pages_bytes();
  PeakResidentSampler sampler;
  GreedyClients greedy(endpoint, kGreedyClients, kGreedySources, pd::MessageType::kRegisterLayout,
                       pd::kMaxControlPayloadBytes);
  ASSERT_EQ(greedy.connected(), kGreedyClients);
  std::thread attack([&] { greedy.pump(payload, Clock::now() + kFloodDeadline); });
  pair.transfer_and_verify(2);  // alongside
  attack.join();
  const uint64_t peak = sampler.stop();
  // Each was closed on its header: none could make the prefill take its 16 MiB.
  EXPECT_EQ(greedy.refused(), kGreedyClients);
  EXPECT_LT(greedy.most_sent(), payload.size());
  EXPECT_LE(peak, rss_before + kMaxPeakRiseBytes)
      << "resident " << (peak >> 20) << " MiB at the peak, " << (rss_before >> 20) << " before";
  const uint64_t rss_after = expect_nothing_stays(pair, greedy, rss_before, threads_before);
  pair.transfer_and_verify(3);  // and after
  std::printf(
      "%s: %zu connections claiming %u bytes; resident before %.1f MiB, peak +%.1f MiB, "
      "after %+.1f MiB; most any sent %llu bytes\n",
      secret ? "with a secret" : "without a secret", kGreedyClients, pd::kMaxControlPayloadBytes,
      rss_before / 1048576.0,
      (static_cast<double>(peak) - static_cast<double>(rss_before)) / 1048576.0,
      (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / 1048576.0,
      static_cast<unsigned long long>(greedy.most_sent()));
}

TEST(ControlPortPreAuthFlood, SixteenMiBFramesBeforeTheProofCostLittleAndNothingStays) {
  flood_first_frames("pd-plane-secret");
}

TEST(ControlPortPreAuthFlood, SixteenMiBFramesBeforeRegistrationCostLittleAndNothingStays) {
  flood_first_frames(std::nullopt);
}

// The most an unregistered connection can hold without a secret: a frame that claims exactly
// the cap, all of it sent but its last byte, so the prefill keeps the buffer while it waits.
TEST(ControlPortPreAuthFlood, FramesOfExactlyTheCapHeldOpenCostAtMostTheCapEach) {
  PdPair pair(std::nullopt);
  pair.transfer_and_verify(1);
  const uint32_t cap = pd::max_registration_payload_bytes(pair.p.buffers);
  std::vector<std::byte> payload(cap - 1);
  fill_pattern(payload, 23);
  const Endpoint endpoint = must(parse_endpoint(pair.prefill->control_endpoint()));
  const uint64_t threads_before = thread_count();
  const uint64_t rss_before = resident_pages_bytes();
  PeakResidentSampler sampler;
  GreedyClients greedy(endpoint, kGreedyClients, kGreedySources, pd::MessageType::kRegisterLayout,
                       cap);
  ASSERT_EQ(greedy.connected(), kGreedyClients);
  greedy.pump(payload, Clock::now() + kFloodDeadline);
  EXPECT_EQ(greedy.refused(), 0u);  // each is within the cap: held, not refused
  EXPECT_EQ(greedy.most_sent(), payload.size());
  // Until the prefill has read what it was sent: nothing unread on its side of the control
  // port, nothing of the clients' unacknowledged. Not every socket of this process: the
  // prefill's heartbeats to the clients, which never read, wait for delayed acknowledgements
  // (some are always in flight once the connections are a few seconds old), and a client,
  // bound to 127.0.0.2 and up, may have drawn the control port's number as its own.
  in_addr_t control_address = INADDR_ANY;
  ASSERT_EQ(::inet_pton(AF_INET, endpoint.host.c_str(), &control_address), 1) << endpoint.host;
  uint64_t unread = 0;
  uint64_t unacknowledged = 0;
  ASSERT_TRUE(eventually(
      [&] {
        unread = tcp_queues(::getpid(), endpoint.port, control_address).unread;
        unacknowledged = greedy.unacknowledged();
        return unread == 0 && unacknowledged == 0;
      },
      kFloodDeadline))
      << unread << " bytes unread on the control port, " << unacknowledged
      << " of the clients' unacknowledged";
  EXPECT_EQ(pair.prefill->stats().decode_connections, kGreedyClients + 1)
      << "the prefill let go of held connections (or the decode's)";
  pair.transfer_and_verify(2);  // alongside, while the prefill holds every buffer
  const uint64_t peak = sampler.stop();
  EXPECT_LE(peak, rss_before + kMaxPeakRiseBytes)
      << "resident " << (peak >> 20) << " MiB at the peak, " << (rss_before >> 20) << " before";
  const uint64_t rss_after = expect_nothing_stays(pair, greedy, rss_before, threads_before);
  std::printf(
      "%zu connections holding %u of a %u-byte frame; resident before %.1f MiB, peak "
      "+%.1f MiB, after %+.1f MiB\n",
      kGreedyClients, cap - 1, cap, rss_before / 1048576.0,
      (static_cast<double>(peak) - static_cast<double>(rss_before)) / 1048576.0,
      (static_cast<double>(rss_after) - static_cast<double>(rss_before)) / 1048576.0);
}

// The decode side: a "prefill" (whatever answers on the control endpoint the bootstrap server
// names) that greets properly, then sends a frame claiming 16 MiB before any RegisterReply. The
// decode takes no more than a RegisterReply before the reply: it closes the link on the header,
// and the request fails instead of waiting.
TEST(ControlPortPreAuthFlood, APrefillSendingSixteenMiBBeforeItsReplyIsDroppedOnTheHeader) {
  auto bootstrap = must(pd::BootstrapServer::start({}));
  Endpoint fake_endpoint;
  Fd listener = must(listen_tcp(must(parse_endpoint("127.0.0.1:0", true)), &fake_endpoint));
  std::atomic<uint64_t> taken{0};
  std::atomic<bool> dropped{false};
  std::thread fake([&] {
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!conn.valid()) return;
    send_all(conn.get(), pd::encode_control_message(pd::AuthChallengeMessage{"", 1}),
             Clock::now() + 2s)
        .ignore();
    std::byte header[kFrameHeaderBytes];
    encode_frame_header(FrameHeader{pd::kControlMagic, pd::kControlVersion,
                                    static_cast<uint16_t>(pd::MessageType::kRegisterReply),
                                    pd::kMaxControlPayloadBytes},
                        header);
    send_all(conn.get(), header, Clock::now() + 2s).ignore();
    std::vector<std::byte> chunk(size_t{64} << 10, std::byte{0x5A});
    const auto until = Clock::now() + 5s;
    while (Clock::now() < until && taken < pd::kMaxControlPayloadBytes) {
      ssize_t n = ::send(conn.get(), chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        taken += static_cast<uint64_t>(n);
      } else if ((n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
                 closed_by_other_side(conn.get())) {
        dropped = true;
        return;
      } else {
        std::this_thread::sleep_for(1ms);
      }
    }
  });
  pd::RankRegistration rank;
  rank.control_endpoint = fake_endpoint.to_string();
  rank.engine_endpoint = "127.0.0.1:1";
  rank.page_size_tokens = ModelShape{}.page_tokens;
  rank.dtype_bytes = 2;
  ASSERT_TRUE(pd::BootstrapClient(bootstrap->address(), 2s).register_rank(rank).ok());
  TestRank d = pd::testing::make_rank("decode", ModelShape{}, 1, 0);
  auto decode = pd::testing::make_decode(d, PdPair::timeouts());
  pd::KvReceiver receiver = must(decode->create_receiver(bootstrap->address(), 4));
  ASSERT_TRUE(receiver.init(pd::testing::pages_from(0, 2)).ok());
  EXPECT_EQ(receiver.wait_final(10s), pd::RequestState::kFailed);
  fake.join();
  EXPECT_TRUE(dropped) << "the decode kept reading a 16 MiB frame before the RegisterReply";
  EXPECT_LT(taken.load(), pd::kMaxControlPayloadBytes);
  std::printf("decode dropped the link after %llu bytes of a 16 MiB frame: %s\n",
              static_cast<unsigned long long>(taken.load()),
              receiver.failure().to_string().c_str());
}

// A frame at the cap is read and answered by its content; one byte more closes the connection
// on its header, before any of it is read.
TEST(ControlPortPreAuthFlood, TheFirstFrameCapIsTheLargestRegistrationOfTheLayout) {
  ModelShape m;
  TestRank p = pd::testing::make_rank("prefill", m, 1, 0);
  const uint32_t cap = pd::max_registration_payload_bytes(p.buffers);
  pd::RegisterLayout real;
  real.engine_endpoint = std::string(pd::kMaxEndpointBytes, 'e');
  real.info = p.buffers.layout.info();
  real.entries.assign(p.buffers.layout.entries().begin(), p.buffers.layout.entries().end());
  real.aux = p.buffers.aux;
  real.state = p.buffers.state;
  const size_t real_bytes = pd::encode_control_message(real).size() - pd::kFrameHeaderBytes;
  EXPECT_EQ(cap, real_bytes + pd::kRegistrationSlackBytes);
  EXPECT_EQ(pd::max_proof_payload_bytes(), sizeof(uint32_t) + pd::kMaxAuthBytes);

  pd::PrefillServerOptions o = pd::testing::prefill_options(p, "", PdPair::timeouts());
  auto prefill = must(pd::PrefillServer::create(std::move(o)));
  const Endpoint endpoint = must(parse_endpoint(prefill->control_endpoint()));
  // A registration exactly `cap` bytes long: entries its layout does not have (padded with aux
  // buffers of 24 bytes and an endpoint of the remainder), refused with a RegisterReply.
  pd::RegisterLayout padded;
  padded.info = p.buffers.layout.info();
  const size_t base = pd::encode_control_message(padded).size() - pd::kFrameHeaderBytes;
  constexpr size_t kAuxWireBytes = 24;
  padded.aux.resize((cap - base) / kAuxWireBytes);
  padded.engine_endpoint.assign((cap - base) % kAuxWireBytes, 'e');
  std::vector<std::byte> at_cap = pd::encode_control_message(padded);
  ASSERT_EQ(at_cap.size() - pd::kFrameHeaderBytes, cap);
  {
    Fd fd = connect_from("127.0.0.2", endpoint);
    ASSERT_TRUE(send_all(fd.get(), at_cap, Clock::now() + 2s).ok());
    bool replied = false;
    for (int i = 0; i < 20 && !replied; ++i) {
      std::byte header[pd::kFrameHeaderBytes];
      if (!recv_all(fd.get(), header, Clock::now() + 2s).ok()) break;
      pd::FrameHeader h = must(pd::decode_frame_header(header));
      std::vector<std::byte> body(h.payload_bytes);
      ASSERT_TRUE(recv_all(fd.get(), body, Clock::now() + 2s).ok());
      replied = h.type == pd::MessageType::kRegisterReply;
      if (replied) {
        pd::ControlMessage reply = must(pd::decode_control_payload(h.type, body));
        EXPECT_EQ(std::get<pd::RegisterReply>(reply).code, StatusCode::kInvalidArgument);
      }
    }
    EXPECT_TRUE(replied) << "a registration of exactly the cap was not answered";
  }
  {
    Fd fd = connect_from("127.0.0.2", endpoint);
    std::byte header[pd::kFrameHeaderBytes];
    encode_frame_header(
        FrameHeader{pd::kControlMagic, pd::kControlVersion,
                    static_cast<uint16_t>(pd::MessageType::kRegisterLayout), cap + 1},
        header);
    ASSERT_TRUE(send_all(fd.get(), header, Clock::now() + 2s).ok());
    EXPECT_TRUE(eventually([&] { return closed_by_other_side(fd.get()); }, 2s))
        << "a header claiming one byte over the cap did not close the connection";
  }
}

}  // namespace
}  // namespace kvferry::testing
