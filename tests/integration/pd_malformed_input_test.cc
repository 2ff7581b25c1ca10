// Malformed input to real PD processes: control frames on a raw socket to a `pd-prefill`
// rank and HTTP requests to a `kvferry bootstrap` server. Each is rejected (the connection
// closed or an HTTP error returned), logged with the bad value named, and the process goes on
// serving a following valid request, bytes verified.
#include <sys/socket.h>

#include <cstring>
#include <random>

#include "core/net.h"
#include "integration/pd_fault_support.h"
#include "kvferry/pd/control_message.h"

namespace kvferry::testing {
namespace {

using pd::kControlMagic;
using pd::kControlVersion;

std::vector<std::byte> header(uint32_t magic, uint16_t version, uint16_t type,
                              uint32_t payload_bytes) {
  std::vector<std::byte> h(pd::kFrameHeaderBytes);
  std::memcpy(h.data(), &magic, 4);  // little-endian hosts only, like the protocol
  std::memcpy(h.data() + 4, &version, 2);
  std::memcpy(h.data() + 6, &type, 2);
  std::memcpy(h.data() + 8, &payload_bytes, 4);
  return h;
}

Fd connect_to(const std::string& address) {
  Endpoint endpoint = must(parse_endpoint(address));
  return must(connect_tcp(endpoint, Clock::now() + 5s));
}

// Sends `bytes` (then, with `end`, no more), and returns how the peer answered: the status
// of reading on, past what the peer sends first (its AuthChallenge, heartbeats), which is
// PeerDisconnected once the peer dropped the connection.
Status send_and_probe(const std::string& address, std::span<const std::byte> bytes,
                      bool end = false) {
  Fd fd = connect_to(address);
  Status sent = send_all(fd.get(), bytes, Clock::now() + 5s);
  if (!sent.ok()) return sent;
  if (end) ::shutdown(fd.get(), SHUT_WR);
  std::byte probe[1];
  for (int i = 0; i < 4096; ++i) {
    if (Status s = recv_all(fd.get(), probe, Clock::now() + 5s); !s.ok()) return s;
  }
  return Internal("the peer kept the connection open");
}

std::vector<std::byte> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

TEST_F(PdFaultTest, MalformedControlFramesAreRejectedAndPrefillKeepsServing) {
  PdProcess prefill = start_prefill(0);
  const std::string control = prefill.hello.value("control", "");
  ASSERT_FALSE(control.empty()) << prefill.hello.dump();
  constexpr uint16_t kHeartbeat = static_cast<uint16_t>(pd::MessageType::kHeartbeat);

  struct Case {
    const char* name;
    std::vector<std::byte> bytes;
    bool end;
    const char* logged;  // what the prefill's log must say about it
  };
  std::vector<Case> cases = {
      {"bad magic", header(0x12345678, kControlVersion, kHeartbeat, 16), false,
       "control frame magic 305419896"},
      {"bad version", header(kControlMagic, 99, kHeartbeat, 16), false,
       "control protocol version 99"},
      {"unknown type", header(kControlMagic, kControlVersion, 77, 0), false,
       "control message type 77"},
      {"oversized length", header(kControlMagic, kControlVersion, kHeartbeat, 0xFFFFFFFF), false,
       "control payload of 4294967295 bytes"},
      {"payload too short for its type", header(kControlMagic, kControlVersion, kHeartbeat, 4),
       false, "malformed Heartbeat message"},
      {"stream ends inside a frame", header(kControlMagic, kControlVersion, kHeartbeat, 100), true,
       "lost decode connection"},
      {"random bytes", random_bytes(4096, 2026), false, "rejected frame"},
  };
  cases[4].bytes.resize(cases[4].bytes.size() + 4);  // the 4 payload bytes it announces
  for (const Case& c : cases) {
    EXPECT_EQ(send_and_probe(control, c.bytes, c.end).code(), StatusCode::kPeerDisconnected)
        << c.name;
  }
  // Valid frames out of order are answered, not dropped: a request before the layout.
  {
    Fd fd = connect_to(control);
    pd::TransferRequest early;
    early.room = 99;
    early.dst_pages = {1, 2};
    ASSERT_TRUE(send_all(fd.get(), pd::encode_control_message(early), Clock::now() + 5s).ok());
    // The answer, after the connection's AuthChallenge (empty: no secret) and any heartbeat.
    pd::ControlMessage answer;
    for (int i = 0; i < 16; ++i) {
      std::vector<std::byte> reply(pd::kFrameHeaderBytes);
      ASSERT_TRUE(recv_all(fd.get(), reply, Clock::now() + 5s).ok());
      pd::FrameHeader h = must(pd::decode_frame_header(reply));
      reply.resize(reply.size() + h.payload_bytes);
      ASSERT_TRUE(
          recv_all(fd.get(), std::span(reply).subspan(pd::kFrameHeaderBytes), Clock::now() + 5s)
              .ok());
      answer = must(pd::decode_control_message(reply));
      if (!std::holds_alternative<pd::AuthChallengeMessage>(answer) &&
          !std::holds_alternative<pd::Heartbeat>(answer)) {
        break;
      }
    }
    ASSERT_TRUE(std::holds_alternative<pd::RequestStatusMessage>(answer));
    auto status = std::get<pd::RequestStatusMessage>(answer);
    EXPECT_EQ(status.room, 99u);
    EXPECT_EQ(status.state, pd::RequestState::kFailed);
    EXPECT_EQ(status.code, StatusCode::kFailedPrecondition);
  }

  PdProcess decode = start_decode();
  expect_verified(prefill, decode, 1, 80);
  const std::string log = prefill.log();
  for (const Case& c : cases) EXPECT_TRUE(contains(log, c.logged)) << c.name << "\n" << log;
}

struct HttpReply {
  int status = 0;  // 0: the server closed without answering
  std::string text;
};

// Sends `request` and reads one response (headers, then Content-Length bytes of body); the
// server may keep the connection open afterwards. Status 0 if it closed without answering.
HttpReply http_exchange(const std::string& address, const std::string& request) {
  Fd fd = connect_to(address);
  EXPECT_TRUE(send_all(fd.get(), std::as_bytes(std::span(request)), Clock::now() + 5s).ok());
  HttpReply reply;
  constexpr size_t kMaxReplyBytes = 4096;  // error replies are small
  auto read_byte = [&]() {
    std::byte one[1];
    Status s = recv_all(fd.get(), one, Clock::now() + 5s);
    if (s.ok()) reply.text.push_back(static_cast<char>(one[0]));
    return s.ok();
  };
  size_t header_end = std::string::npos;
  while (header_end == std::string::npos && reply.text.size() < kMaxReplyBytes && read_byte()) {
    header_end = reply.text.find("\r\n\r\n");
  }
  if (header_end == std::string::npos || reply.text.rfind("HTTP/1.1 ", 0) != 0) return reply;
  reply.status = std::stoi(reply.text.substr(9, 3));
  const size_t length_at = reply.text.find("Content-Length: ");
  const size_t body_bytes =
      length_at < header_end ? std::stoul(reply.text.substr(length_at + 16)) : 0;
  while (reply.text.size() < header_end + 4 + body_bytes && read_byte()) {
  }
  return reply;
}

std::string http_request(const std::string& method, const std::string& target,
                         const std::string& body = "") {
  return method + " " + target + " HTTP/1.1\r\nHost: test\r\nConnection: close\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

TEST_F(PdFaultTest, MalformedHttpRequestsAreRejectedAndBootstrapKeepsServing) {
  struct Case {
    const char* name;
    std::string request;
    int status;
    const char* logged;
  };
  // Random bytes, ended like a request head so the server does not wait for more.
  const std::vector<std::byte> noise = random_bytes(512, 7);
  const std::string random =
      std::string(reinterpret_cast<const char*>(noise.data()), noise.size()) + "\r\n\r\n";
  std::vector<Case> cases = {
      {"garbage request line", "GARBAGE\r\n\r\n", 400, "refused a malformed request"},
      {"body is not JSON", http_request("PUT", "/register", "{\"tp_rank\":"), 400,
       "body is not JSON"},
      {"missing field", http_request("PUT", "/register", "{\"tp_size\": 1}"), 400,
       "missing field 'tp_rank'"},
      {"non-numeric rank", http_request("GET", "/rank?tp_rank=abc"), 400,
       "parameter 'tp_rank' is 'abc'"},
      {"missing rank", http_request("GET", "/rank"), 400, "missing parameter 'tp_rank'"},
      {"unknown route", http_request("GET", "/nowhere"), 404, "no route GET /nowhere"},
      // Over the 64 KiB limit: refused on its Content-Length, the body discarded unparsed.
      {"oversized body", http_request("PUT", "/register", std::string(70'000, '{')), 413,
       "refused a malformed request"},
      {"random bytes", random, -1, ""},  // answered 400 or closed: either is a rejection
  };
  for (const Case& c : cases) {
    HttpReply reply = http_exchange(address_, c.request);
    if (c.status > 0) {
      EXPECT_EQ(reply.status, c.status) << c.name << ": " << reply.text;
    } else {
      EXPECT_TRUE(reply.status == 0 || reply.status == 400) << c.name << ": " << reply.text;
    }
  }
  EXPECT_EQ(http_exchange(address_, http_request("GET", "/health")).status, 503);  // no rank yet

  PdProcess prefill = start_prefill(0);
  PdProcess decode = start_decode();
  expect_verified(prefill, decode, 1, 80);
  EXPECT_EQ(http_exchange(address_, http_request("GET", "/health")).status, 200);
  const std::string log = bootstrap_->log();
  for (const Case& c : cases) EXPECT_TRUE(contains(log, c.logged)) << c.name << "\n" << log;
}

}  // namespace
}  // namespace kvferry::testing
