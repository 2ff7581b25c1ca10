#include "metadata/handshake.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/auth.h"
#include "core/frame_header.h"
#include "core/logging.h"
#include "metadata/segment_descriptor.h"

namespace kvferry {
namespace {

constexpr size_t kMaxRequestPayload = 4096;
constexpr FrameFormat kHandshakeFormat{"handshake", kHandshakeMagic, kHandshakeVersion,
                                       static_cast<uint16_t>(HandshakeFrame::kProof)};
static_assert(kHandshakeHeaderBytes == kFrameHeaderBytes);

std::vector<std::byte> make_frame(HandshakeFrame type, std::string_view payload) {
  std::vector<std::byte> frame(kHandshakeHeaderBytes + payload.size());
  encode_handshake_header(
      {kHandshakeMagic, kHandshakeVersion, type, static_cast<uint32_t>(payload.size())},
      frame.data());
  if (!payload.empty()) {  // an empty view's data() may be null: not for memcpy
    std::memcpy(frame.data() + kHandshakeHeaderBytes, payload.data(), payload.size());
  }
  return frame;
}

}  // namespace

void encode_handshake_header(const HandshakeHeader& h, std::byte* out) {
  encode_frame_header({h.magic, h.version, static_cast<uint16_t>(h.type), h.length},
                      std::span<std::byte, kFrameHeaderBytes>(out, kFrameHeaderBytes));
}

Result<HandshakeHeader> decode_handshake_header(const std::byte* in, size_t max_length) {
  const auto limit = static_cast<uint32_t>(std::min<size_t>(max_length, UINT32_MAX));
  KVF_ASSIGN_OR_RETURN(FrameHeader h,
                       decode_frame_header(kHandshakeFormat, {in, kFrameHeaderBytes}, limit));
  return HandshakeHeader{h.magic, h.version, static_cast<HandshakeFrame>(h.type), h.payload_bytes};
}

Result<std::unique_ptr<HandshakeServer>> HandshakeServer::start(
    const Endpoint& listen, DescriptorSource source, std::chrono::milliseconds io_timeout,
    int threads, std::optional<std::string> secret) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Acceptor> acceptor,
                       Acceptor::bind(listen, Acceptor::Options::named("handshake")));
  auto server = std::unique_ptr<HandshakeServer>(new HandshakeServer(
      std::move(acceptor), std::move(source), io_timeout, threads, std::move(secret)));
  // Each connection is served on the pool, so one slow client never blocks others; every
  // read and write is bounded by io_timeout_.
  server->acceptor_->start([s = server.get()](Fd conn) {
    auto holder = std::make_shared<Fd>(std::move(conn));
    s->pool_.post([s, holder] { s->serve(std::move(*holder)); });
  });
  return server;
}

HandshakeServer::HandshakeServer(std::unique_ptr<Acceptor> acceptor, DescriptorSource source,
                                 std::chrono::milliseconds io_timeout, int threads,
                                 std::optional<std::string> secret)
    : acceptor_(std::move(acceptor)),
      source_(std::move(source)),
      io_timeout_(io_timeout),
      secret_(std::move(secret)),
      pool_(threads) {}

HandshakeServer::~HandshakeServer() {
  acceptor_->stop();  // before the pool goes: the acceptor posts to it
}

void HandshakeServer::serve(Fd connection) {
  auto deadline = Clock::now() + io_timeout_;
  std::byte header_bytes[kHandshakeHeaderBytes];
  if (!recv_all(connection.get(), header_bytes, deadline).ok()) return;
  auto header = decode_handshake_header(header_bytes, kMaxRequestPayload);
  std::vector<std::byte> reply;
  if (!header.ok()) {
    log().warn("handshake: rejected a request: {}", header.status().message());
    reply = make_frame(HandshakeFrame::kError, header.status().message());
  } else if (header->type != HandshakeFrame::kGetDescriptor) {
    reply = make_frame(HandshakeFrame::kError, "expected a GetDescriptor request");
  } else {
    std::vector<std::byte> ignored(header->length);
    if (!recv_all(connection.get(), ignored, deadline).ok()) return;
    if (Status auth = authenticate(connection.get(), deadline); !auth.ok()) {
      if (auth.code() != StatusCode::kUnauthenticated) return;  // the connection broke
      log().warn("handshake: refused the descriptor: {}", auth.message());
      reply = make_frame(HandshakeFrame::kError, auth.message());
    } else {
      reply = make_frame(HandshakeFrame::kDescriptor, source_());
    }
  }
  send_all(connection.get(), reply, deadline).ignore();
}

Status HandshakeServer::authenticate(int connection, Clock::time_point deadline) {
  if (!secret_) return Status::Ok();
  KVF_ASSIGN_OR_RETURN(AuthNonce nonce, make_auth_nonce());
  auto challenge =
      make_frame(HandshakeFrame::kChallenge,
                 std::string_view(reinterpret_cast<const char*>(nonce.data()), nonce.size()));
  KVF_RETURN_IF_ERROR(send_all(connection, challenge, deadline));
  std::byte header_bytes[kHandshakeHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(connection, header_bytes, deadline));
  auto header = decode_handshake_header(header_bytes, sizeof(AuthProof));
  if (!header.ok()) return Unauthenticated("no proof of the secret: " + header.status().message());
  if (header->type != HandshakeFrame::kProof || header->length != sizeof(AuthProof)) {
    return Unauthenticated("expected a Proof of the secret");
  }
  AuthProof proof{};
  KVF_RETURN_IF_ERROR(recv_all(connection, proof, deadline));
  if (!auth_proof_matches(auth_proof(*secret_, nonce), proof)) {
    return Unauthenticated("wrong secret");
  }
  return Status::Ok();
}

Result<std::string> fetch_descriptor(const Endpoint& endpoint, Clock::time_point deadline,
                                     const std::optional<std::string>& secret) {
  KVF_ASSIGN_OR_RETURN(Fd conn, connect_tcp(endpoint, deadline));
  auto request = make_frame(HandshakeFrame::kGetDescriptor, {});
  auto unreachable = [&](const Status& s) {
    return Status(s.code() == StatusCode::kProtocolError ? s.code() : StatusCode::kPeerUnreachable,
                  "handshake with " + endpoint.to_string() + ": " + s.message());
  };
  if (Status s = send_all(conn.get(), request, deadline); !s.ok()) return unreachable(s);
  std::byte header_bytes[kHandshakeHeaderBytes];
  if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return unreachable(s);
  auto header = decode_handshake_header(header_bytes, kMaxDescriptorBytes);
  if (!header.ok()) return unreachable(header.status());
  bool proved = false;
  if (header->type == HandshakeFrame::kChallenge) {
    if (header->length != sizeof(AuthNonce)) {
      return ProtocolError("handshake with " + endpoint.to_string() + ": challenge of " +
                           std::to_string(header->length) + " bytes (expected " +
                           std::to_string(sizeof(AuthNonce)) + ")");
    }
    AuthNonce nonce{};
    if (Status s = recv_all(conn.get(), nonce, deadline); !s.ok()) return unreachable(s);
    if (!secret) {
      return Unauthenticated("peer " + endpoint.to_string() +
                             " requires authentication; no secret is configured here "
                             "(EngineOptions::secret or KVFERRY_SECRET)");
    }
    AuthProof proof = auth_proof(*secret, nonce);
    auto answer =
        make_frame(HandshakeFrame::kProof,
                   std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
    if (Status s = send_all(conn.get(), answer, deadline); !s.ok()) return unreachable(s);
    if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return unreachable(s);
    header = decode_handshake_header(header_bytes, kMaxDescriptorBytes);
    if (!header.ok()) return unreachable(header.status());
    proved = true;
  }
  std::string payload(header->length, '\0');
  std::span<std::byte> payload_bytes(reinterpret_cast<std::byte*>(payload.data()), payload.size());
  if (Status s = recv_all(conn.get(), payload_bytes, deadline); !s.ok()) return unreachable(s);
  if (header->type == HandshakeFrame::kError && proved) {
    return Unauthenticated("peer " + endpoint.to_string() +
                           " refused our credentials (wrong secret?): " + payload);
  }
  if (header->type == HandshakeFrame::kError) {
    return ProtocolError("handshake with " + endpoint.to_string() + " refused: " + payload);
  }
  if (header->type != HandshakeFrame::kDescriptor) {
    return ProtocolError("handshake with " + endpoint.to_string() + ": unexpected frame type");
  }
  return payload;
}

}  // namespace kvferry
