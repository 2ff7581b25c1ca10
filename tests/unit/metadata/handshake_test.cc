#include "metadata/handshake.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <thread>

#include "core/net.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::make_engine;

// A listener that answers every connection with `reply` bytes, then closes.
class FakePeer {
 public:
  explicit FakePeer(std::string reply, bool answer = true) : reply_(std::move(reply)) {
    Endpoint bound;
    listener_ = std::move(listen_tcp({"127.0.0.1", 0}, &bound)).value();
    endpoint_ = bound.to_string();
    if (answer) {
      thread_ = std::thread([this] {
        int c = ::accept(listener_.get(), nullptr, nullptr);
        if (c < 0) return;
        Fd conn(c);
        std::byte header[kHandshakeHeaderBytes];
        recv_all(conn.get(), header, Clock::now() + std::chrono::seconds(2)).ignore();
        send_all(conn.get(), {reinterpret_cast<const std::byte*>(reply_.data()), reply_.size()},
                 Clock::now() + std::chrono::seconds(2))
            .ignore();
      });
    }
  }
  ~FakePeer() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  std::string reply_;
  Fd listener_;
  std::string endpoint_;
  std::thread thread_;
};

std::string frame(HandshakeFrame type, const std::string& payload, uint32_t claimed_length) {
  std::string out(kHandshakeHeaderBytes, '\0');
  encode_handshake_header({kHandshakeMagic, kHandshakeVersion, type, claimed_length},
                          reinterpret_cast<std::byte*>(out.data()));
  return out + payload;
}

TEST(Handshake, PeerDownIsPeerUnreachableWithinTheTimeout) {
  Endpoint bound;
  { auto closed = listen_tcp({"127.0.0.1", 0}, &bound); }  // bound then closed: refused
  auto engine = make_engine("h");
  auto t0 = Clock::now();
  auto r = engine->open_peer(bound.to_string());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPeerUnreachable);
  EXPECT_TRUE(contains(r.status().message(), bound.to_string()));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
}

TEST(Handshake, SilentPeerIsPeerUnreachableAfterTheHandshakeTimeout) {
  FakePeer silent("", /*answer=*/false);  // accepts in the backlog, never replies
  EngineOptions o;
  o.handshake_timeout = std::chrono::milliseconds(300);
  auto engine = testing::must(TransferEngine::create(o));
  auto t0 = Clock::now();
  auto r = engine->open_peer(silent.endpoint());
  auto took = Clock::now() - t0;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kPeerUnreachable) << r.status().to_string();
  EXPECT_GE(took, std::chrono::milliseconds(250));
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST(Handshake, MalformedDescriptorIsAProtocolError) {
  FakePeer liar(frame(HandshakeFrame::kDescriptor, "{not json", 9));
  auto engine = make_engine("h");
  auto r = engine->open_peer(liar.endpoint());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
}

TEST(Handshake, OversizedDescriptorIsRefusedBeforeReadingIt) {
  FakePeer huge(frame(HandshakeFrame::kDescriptor, "", 0xFFFFFFF0u));
  auto engine = make_engine("h");
  auto r = engine->open_peer(huge.endpoint());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_TRUE(contains(r.status().message(), "exceeds the limit")) << r.status().message();
}

TEST(Handshake, WrongMagicIsAProtocolError) {
  FakePeer http("HTTP/1.1 200 OK\r\n\r\n");
  auto engine = make_engine("h");
  EXPECT_EQ(engine->open_peer(http.endpoint()).status().code(), StatusCode::kProtocolError);
}

TEST(Handshake, ServesManyClientsConcurrently) {
  auto server = make_engine("server");
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&] {
      auto e = parse_endpoint(server->endpoint());
      auto json = fetch_descriptor(*e, Clock::now() + std::chrono::seconds(5));
      if (json.ok() && parse_segment_descriptor(*json).ok()) ok.fetch_add(1);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 16);
}

// With a secret the descriptor (addresses, pid, memfds) goes only to a client that proves
// it; the refused ones receive no byte of it.
TEST(HandshakeAuth, DescriptorIsServedOnlyWithTheSecret) {
  auto server = make_engine("server", 2, "handshake-secret");
  std::vector<char> region(4096);
  ASSERT_TRUE(server->register_memory(region.data(), region.size()).ok());
  const Endpoint e = testing::must(parse_endpoint(server->endpoint()));
  const auto deadline = [] { return Clock::now() + std::chrono::seconds(5); };
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("another-secret")}) {
    auto refused = fetch_descriptor(e, deadline(), secret);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated)
        << refused.status().to_string();
    EXPECT_FALSE(contains(refused.status().message(), "regions")) << refused.status().message();
  }
  // A raw client that sends GetDescriptor and reads whatever comes gets the challenge only.
  Fd raw = testing::must(connect_tcp(e, deadline()));
  std::string request = frame(HandshakeFrame::kGetDescriptor, "", 0);
  ASSERT_TRUE(send_all(raw.get(),
                       {reinterpret_cast<const std::byte*>(request.data()), request.size()},
                       deadline())
                  .ok());
  std::byte header[kHandshakeHeaderBytes];
  ASSERT_TRUE(recv_all(raw.get(), header, deadline()).ok());
  auto h = decode_handshake_header(header, 1 << 20);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->type, HandshakeFrame::kChallenge);
  // An engine without the secret cannot open it; one with it can.
  auto stranger = make_engine("stranger");
  auto opened = stranger->open_peer(server->endpoint());
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), StatusCode::kUnauthenticated) << opened.status().to_string();
  auto json = fetch_descriptor(e, deadline(), std::string("handshake-secret"));
  ASSERT_TRUE(json.ok()) << json.status().to_string();
  auto d = parse_segment_descriptor(*json);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->regions.size(), 1u);
  auto friend_engine = make_engine("friend", 2, "handshake-secret");
  EXPECT_TRUE(friend_engine->open_peer(server->endpoint()).ok());
}

TEST(PeerNames, MalformedNamesAreInvalidArgumentNamingThem) {
  auto engine = make_engine("h");
  for (const char* bad : {"nohost", ":123", "host:", "host:abc", "host:70000", "host:0", "a b:1"}) {
    auto r = engine->open_peer(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_TRUE(contains(r.status().message(), bad)) << r.status().message();
  }
}

}  // namespace
}  // namespace kvferry
