// RawTcpClient: a hand-driven connection to an engine's tcp data endpoint, for tests that
// speak the wire protocol (src/transport/tcp/tcp_wire.h) directly — including frames no
// well-behaved initiator would send. Every read waits at most one second.
//
// Thread-safety: one object per thread.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "core/auth.h"
#include "core/fd.h"
#include "core/net.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry::testing {

inline constexpr std::chrono::seconds kRawReadTimeout{1};

// The tcp data endpoint an engine advertises in its descriptor (fetched over the handshake,
// proving `secret` when the engine has one).
inline Result<Endpoint> fetch_tcp_endpoint(const std::string& handshake_endpoint,
                                           const std::optional<std::string>& secret = {}) {
  KVF_ASSIGN_OR_RETURN(Endpoint handshake, parse_endpoint(handshake_endpoint));
  KVF_ASSIGN_OR_RETURN(std::string json,
                       fetch_descriptor(handshake, Clock::now() + std::chrono::seconds(5), secret));
  KVF_ASSIGN_OR_RETURN(SegmentDescriptor descriptor, parse_segment_descriptor(json));
  if (descriptor.tcp_endpoint.empty()) {
    return NotSupported("engine " + handshake_endpoint + " advertises no tcp endpoint");
  }
  return parse_endpoint(descriptor.tcp_endpoint);
}

inline std::vector<std::byte> encode_frame(const TcpHeader& header,
                                           std::span<const std::byte> payload = {}) {
  std::vector<std::byte> out(kTcpHeaderBytes);
  encode_tcp_header(header, out.data());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

struct RawFrame {
  TcpHeader header;
  std::vector<std::byte> payload;
};

class RawTcpClient {
 public:
  static Result<RawTcpClient> connect(const Endpoint& endpoint) {
    KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp(endpoint, Clock::now() + std::chrono::seconds(5)));
    return RawTcpClient(std::move(fd));
  }

  // Sends everything it can. A hostile sender does not care whether the receiver has
  // already hung up, so EPIPE and ECONNRESET end the send quietly.
  void send(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      ssize_t n = ::send(fd_.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      bytes = bytes.subspan(static_cast<size_t>(n));
    }
  }
  void send(const TcpHeader& header, std::span<const std::byte> payload = {}) {
    send(encode_frame(header, payload));
  }
  int fd() const { return fd_.get(); }
  // No more bytes from this side (the receiver reads end of stream).
  void half_close() { ::shutdown(fd_.get(), SHUT_WR); }

  // One frame with its payload.
  Result<RawFrame> read_frame() {
    std::array<std::byte, kTcpHeaderBytes> raw{};
    const auto deadline = Clock::now() + kRawReadTimeout;
    KVF_RETURN_IF_ERROR(recv_all(fd_.get(), raw, deadline));
    RawFrame frame;
    KVF_ASSIGN_OR_RETURN(frame.header, decode_tcp_header(raw.data()));
    if (tcp_frame_has_payload(frame.header.type)) {
      frame.payload.resize(frame.header.length);
      KVF_RETURN_IF_ERROR(recv_all(fd_.get(), frame.payload, deadline));
    }
    return frame;
  }

  // kHello, then kHelloAck; keeps the nonce it carries when authentication is on.
  Status hello() {
    TcpHeader h;
    h.type = TcpFrame::kHello;
    send(h);
    KVF_ASSIGN_OR_RETURN(RawFrame reply, read_frame());
    if (reply.header.type != TcpFrame::kHelloAck) {
      return ProtocolError("expected kHelloAck, got frame type " +
                           std::to_string(static_cast<int>(reply.header.type)));
    }
    nonce_ = std::move(reply.payload);
    hello_ack_ = reply.header;
    return Status::Ok();
  }
  const std::vector<std::byte>& nonce() const { return nonce_; }
  // The kHelloAck's header, once hello() succeeded.
  const TcpHeader& hello_ack() const { return hello_ack_; }

  // A kAuth frame proving `secret` for this connection's nonce.
  std::vector<std::byte> auth_frame(const std::string& secret, uint64_t request_id) const {
    TcpHeader h;
    h.type = TcpFrame::kAuth;
    h.request_id = request_id;
    h.length = kTcpProofBytes;
    AuthProof proof = auth_proof(secret, nonce_);
    return encode_frame(h, proof);
  }

  // Whether the receiver closes the connection (end of stream or reset) within `wait`
  // without sending anything first; `what` says what happened otherwise.
  bool closed_by_peer(std::string& what,
                      std::chrono::milliseconds wait = std::chrono::milliseconds(1000)) {
    const auto deadline = Clock::now() + wait;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        what = "still open after " + std::to_string(wait.count()) + " ms";
        return false;
      }
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      std::array<std::byte, 256> buffer;
      ssize_t n = ::recv(fd_.get(), buffer.data(), buffer.size(), 0);
      if (n == 0) return true;
      if (n < 0 && errno == ECONNRESET) return true;
      if (n < 0 && errno == EINTR) continue;
      what = n > 0 ? "the receiver sent " + std::to_string(n) + " bytes instead of closing"
                   : "recv failed: errno " + std::to_string(errno);
      return false;
    }
  }

 private:
  explicit RawTcpClient(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
  std::vector<std::byte> nonce_;
  TcpHeader hello_ack_;
};

}  // namespace kvferry::testing
