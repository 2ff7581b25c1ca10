// The embedded p2p handshake: each engine listens on a TCP port and answers
// "send me your segment descriptor". No server to run, as with Mooncake's P2PHANDSHAKE.
//
// Wire format (docs/PROTOCOL.md): the 12-byte frame header of core/frame_header.h — magic
// "KVFH", version u16, type u16, payload length u32, little-endian — then the payload. A request
// has no payload; the reply is a kDescriptor frame carrying JSON, or kError with a message. Both
// sides bound the payload size and every read and write by a deadline.
//
// Authentication (a server started with a secret): the server greets every connection with
// kChallenge (a 32-byte nonce, core/auth.h); the client, having sent GetDescriptor, answers
// kProof (HMAC-SHA256(secret, nonce)); only then does the server send the descriptor. A
// wrong or missing proof gets kError and nothing else; fetch_descriptor returns
// Unauthenticated. The server proves the secret back: the client's GetDescriptor carries a
// 32-byte nonce of its own, and the kDescriptor reply is followed by a kProof frame,
// descriptor_signature(secret, that nonce, the descriptor). A client that holds the secret
// refuses a server that sends no challenge or no such proof (a fake handshake server that
// serves a forged descriptor to anyone).
//
// The server is a RequestServer (core/request_server.h): one epoll thread serves every
// connection at once, each bounded by ListenerLimits::hello_timeout and counted against the
// limits per listener and per source, so slow or idle clients cannot keep others waiting.
//
// Thread-safety: HandshakeServer's methods are thread-safe; it serves connections
// concurrently on its own thread. fetch_descriptor is a free function.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/log_throttle.h"
#include "core/net.h"
#include "core/request_server.h"
#include "kvferry/listener_limits.h"
#include "kvferry/status.h"

namespace kvferry {

inline constexpr uint32_t kHandshakeMagic = 0x4846564B;  // "KVFH" in memory order
inline constexpr uint16_t kHandshakeVersion = 1;
enum class HandshakeFrame : uint16_t {
  kGetDescriptor = 1,
  kDescriptor = 2,
  kError = 3,
  kChallenge = 4,  // server -> client: payload = 32-byte nonce (authentication on)
  kProof = 5,      // client -> server: payload = HMAC-SHA256(secret, nonce)
};
inline constexpr size_t kHandshakeHeaderBytes = 12;

struct HandshakeHeader {
  uint32_t magic = kHandshakeMagic;
  uint16_t version = kHandshakeVersion;
  HandshakeFrame type = HandshakeFrame::kGetDescriptor;
  uint32_t length = 0;
};

void encode_handshake_header(const HandshakeHeader& header, std::byte* out);
// The server's proof over a descriptor it serves: HMAC-SHA256(secret, context, the client's
// nonce, the descriptor).
std::array<std::byte, 32> descriptor_signature(std::string_view secret,
                                               std::span<const std::byte> client_nonce,
                                               std::string_view descriptor);
// Checks magic, version, type and `length <= max_length`; the error names the bad field.
Result<HandshakeHeader> decode_handshake_header(const std::byte* in, size_t max_length);

class HandshakeServer {
 public:
  // Returns the descriptor JSON to serve now (shared, not copied: with 100,000 regions it
  // is 5 MB).
  using DescriptorSource = std::function<std::shared_ptr<const std::string>()>;

  // `limits.hello_timeout` bounds each connection from accept to the last reply byte.
  static Result<std::unique_ptr<HandshakeServer>> start(const Endpoint& listen,
                                                        DescriptorSource source,
                                                        const ListenerLimits& limits,
                                                        std::optional<std::string> secret = {});
  ~HandshakeServer() = default;
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  const Endpoint& endpoint() const { return server_->endpoint(); }
  uint32_t open_connections() const { return server_->open_connections(); }
  // Connections closed before their request was whole, to admit newer ones.
  uint64_t evicted() const { return server_->evicted(); }

 private:
  HandshakeServer(DescriptorSource source, std::optional<std::string> secret)
      : source_(std::move(source)), secret_(std::move(secret)) {}
  // The reply to a whole request (GetDescriptor, then with a secret the Proof answering
  // `greeting`, the Challenge frame this connection was sent).
  std::string reply(std::span<const std::byte> request, const std::string& greeting) const;

  DescriptorSource source_;
  std::optional<std::string> secret_;  // authentication on when set
  // A peer can send bad requests at will: a line per interval, not per request.
  mutable LogThrottle refusals_log_;
  std::unique_ptr<RequestServer> server_;  // last: stopped before source_ goes
};

// Asks the engine at `endpoint` for its descriptor JSON, proving `secret` when the engine
// asks for it. PeerUnreachable when nothing answers before the deadline, ProtocolError for a
// malformed or oversized reply, Unauthenticated when the engine requires a secret and none
// (or another one) is configured here.
Result<std::string> fetch_descriptor(const Endpoint& endpoint, Clock::time_point deadline,
                                     const std::optional<std::string>& secret = {});

}  // namespace kvferry
