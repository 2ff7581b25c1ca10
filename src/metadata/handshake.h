// The embedded p2p handshake: each engine listens on a TCP port and answers
// "send me your segment descriptor". No server to run, as with Mooncake's P2PHANDSHAKE.
//
// Wire format (docs/PROTOCOL.md): the 12-byte frame header of core/frame_header.h — magic
// "KVFH", version u16, type u16, payload length u32, little-endian — then the payload. A request
// has no payload; the reply is a kDescriptor frame carrying JSON, or kError with a message. Both
// sides bound the payload size and every read and write by a deadline.
//
// Authentication (a server started with a secret): the server answers GetDescriptor with
// kChallenge (a 32-byte nonce, core/auth.h); the client answers kProof
// (HMAC-SHA256(secret, nonce)); only then does the server send the descriptor. A wrong or
// missing proof gets kError and nothing else; fetch_descriptor returns Unauthenticated.
//
// Thread-safety: HandshakeServer's methods are thread-safe; it serves connections
// concurrently on its own threads. fetch_descriptor is a free function.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/acceptor.h"
#include "core/fd.h"
#include "core/net.h"
#include "core/thread_pool.h"
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
// Checks magic, version, type and `length <= max_length`; the error names the bad field.
Result<HandshakeHeader> decode_handshake_header(const std::byte* in, size_t max_length);

class HandshakeServer {
 public:
  // Returns the descriptor JSON to serve now.
  using DescriptorSource = std::function<std::string()>;

  static Result<std::unique_ptr<HandshakeServer>> start(const Endpoint& listen,
                                                        DescriptorSource source,
                                                        std::chrono::milliseconds io_timeout,
                                                        int threads = 2,
                                                        std::optional<std::string> secret = {});
  ~HandshakeServer();
  HandshakeServer(const HandshakeServer&) = delete;
  HandshakeServer& operator=(const HandshakeServer&) = delete;

  const Endpoint& endpoint() const { return acceptor_->endpoint(); }

 private:
  HandshakeServer(std::unique_ptr<Acceptor> acceptor, DescriptorSource source,
                  std::chrono::milliseconds io_timeout, int threads,
                  std::optional<std::string> secret);
  void serve(Fd connection);
  // With a secret: challenges the client; OK once it proved the secret.
  Status authenticate(int connection, Clock::time_point deadline);

  std::unique_ptr<Acceptor> acceptor_;
  DescriptorSource source_;
  std::chrono::milliseconds io_timeout_;
  std::optional<std::string> secret_;  // authentication on when set
  ThreadPool pool_;
};

// Asks the engine at `endpoint` for its descriptor JSON, proving `secret` when the engine
// asks for it. PeerUnreachable when nothing answers before the deadline, ProtocolError for a
// malformed or oversized reply, Unauthenticated when the engine requires a secret and none
// (or another one) is configured here.
Result<std::string> fetch_descriptor(const Endpoint& endpoint, Clock::time_point deadline,
                                     const std::optional<std::string>& secret = {});

}  // namespace kvferry
