#include "metadata/handshake.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
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

// The frame as text, with room for `room_after` more bytes: the payload is copied once.
std::string frame_string(HandshakeFrame type, std::string_view payload, size_t room_after = 0) {
  std::string frame;
  frame.reserve(kHandshakeHeaderBytes + payload.size() + room_after);
  frame.resize(kHandshakeHeaderBytes);
  encode_handshake_header(
      {kHandshakeMagic, kHandshakeVersion, type, static_cast<uint32_t>(payload.size())},
      reinterpret_cast<std::byte*>(frame.data()));
  frame.append(payload);
  return frame;
}

}  // namespace

AuthProof descriptor_signature(std::string_view secret, std::span<const std::byte> client_nonce,
                               std::string_view descriptor) {
  std::string message = "kvferry handshake descriptor";
  message.push_back('\0');
  message.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  message.append(descriptor);
  return auth_signature(secret, message);
}

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

Result<std::unique_ptr<HandshakeServer>> HandshakeServer::start(const Endpoint& listen,
                                                                DescriptorSource source,
                                                                const ListenerLimits& limits,
                                                                std::optional<std::string> secret) {
  auto server =
      std::unique_ptr<HandshakeServer>(new HandshakeServer(std::move(source), std::move(secret)));
  RequestServerOptions options;
  options.name = "handshake";
  options.limits = limits;
  const bool authenticated = server->secret_.has_value();
  options.max_request_bytes = kHandshakeHeaderBytes + kMaxRequestPayload +
                              (authenticated ? kHandshakeHeaderBytes + sizeof(AuthProof) : 0);
  if (authenticated) {
    // The challenge goes out on accept, so that the one request (GetDescriptor, Proof) can
    // answer it; a nonce that cannot be drawn greets with nothing, and no proof matches.
    options.greeting = [] {
      Result<AuthNonce> nonce = make_auth_nonce();
      if (!nonce.ok()) {
        log().error("handshake: no challenge: {}", nonce.status().message());
        return std::string();
      }
      return frame_string(HandshakeFrame::kChallenge,
                          {reinterpret_cast<const char*>(nonce->data()), nonce->size()});
    };
  }
  auto frame = [authenticated, s = server.get()](std::span<const std::byte> received) {
    if (received.size() < kHandshakeHeaderBytes) return RequestFraming::need_more();
    auto header = decode_handshake_header(received.data(), kMaxRequestPayload);
    if (!header.ok()) {
      s->refusals_log_.warn("handshake: rejected a request: {}", header.status().message());
      return RequestFraming::refuse(
          frame_string(HandshakeFrame::kError, header.status().message()));
    }
    if (header->type != HandshakeFrame::kGetDescriptor) {
      return RequestFraming::refuse(
          frame_string(HandshakeFrame::kError, "expected a GetDescriptor request"));
    }
    size_t whole = kHandshakeHeaderBytes + header->length;  // the payload is ignored
    if (authenticated) whole += kHandshakeHeaderBytes + sizeof(AuthProof);
    return received.size() < whole ? RequestFraming::need_more() : RequestFraming::complete(whole);
  };
  auto handle = [s = server.get()](std::span<const std::byte> request, const RequestPeer& peer) {
    return s->reply(request, peer.greeting);
  };
  KVF_ASSIGN_OR_RETURN(server->server_,
                       RequestServer::start(listen, std::move(options), frame, handle));
  return server;
}

std::string HandshakeServer::reply(std::span<const std::byte> request,
                                   const std::string& greeting) const {
  if (!secret_) return frame_string(HandshakeFrame::kDescriptor, *source_());
  // The request is GetDescriptor (framed above; its payload the client's nonce), then the
  // Proof.
  auto get = decode_handshake_header(request.data(), kMaxRequestPayload);
  const auto client_nonce = request.subspan(kHandshakeHeaderBytes, get->length);
  const auto proof_frame = request.subspan(kHandshakeHeaderBytes + get->length);
  auto refuse = [this](const std::string& why) {
    refusals_log_.warn("handshake: refused the descriptor: {}", why);
    return frame_string(HandshakeFrame::kError, why);
  };
  auto header = decode_handshake_header(proof_frame.data(), sizeof(AuthProof));
  if (!header.ok()) return refuse("no proof of the secret: " + header.status().message());
  if (header->type != HandshakeFrame::kProof || header->length != sizeof(AuthProof)) {
    return refuse("expected a Proof of the secret");
  }
  const auto challenge = std::as_bytes(std::span(greeting));
  if (challenge.size() != kHandshakeHeaderBytes + sizeof(AuthNonce)) {
    return refuse("no challenge was sent on this connection");
  }
  const AuthProof expected = auth_proof(*secret_, challenge.subspan(kHandshakeHeaderBytes));
  if (!auth_proof_matches(expected, proof_frame.subspan(kHandshakeHeaderBytes))) {
    return refuse("wrong secret");
  }
  const std::shared_ptr<const std::string> descriptor = source_();
  std::string out = frame_string(HandshakeFrame::kDescriptor, *descriptor,
                                 kHandshakeHeaderBytes + sizeof(AuthProof));
  // This server proves the secret too, over the client's nonce and the descriptor itself:
  // a client that holds the secret believes no descriptor without it.
  const AuthProof signature = descriptor_signature(*secret_, client_nonce, *descriptor);
  out += frame_string(HandshakeFrame::kProof,
                      {reinterpret_cast<const char*>(signature.data()), signature.size()});
  return out;
}

Result<std::string> fetch_descriptor(const Endpoint& endpoint, Clock::time_point deadline,
                                     const std::optional<std::string>& secret) {
  KVF_ASSIGN_OR_RETURN(Fd conn, connect_tcp(endpoint, deadline));
  // With a secret, the request carries this side's nonce, which the server's proof covers.
  AuthNonce client_nonce{};
  if (secret) {
    KVF_ASSIGN_OR_RETURN(client_nonce, make_auth_nonce());
  }
  const std::string request =
      frame_string(HandshakeFrame::kGetDescriptor,
                   secret ? std::string_view(reinterpret_cast<const char*>(client_nonce.data()),
                                             client_nonce.size())
                          : std::string_view());
  auto unreachable = [&](const Status& s) {
    return Status(s.code() == StatusCode::kProtocolError ? s.code() : StatusCode::kPeerUnreachable,
                  "handshake with " + endpoint.to_string() + ": " + s.message());
  };
  if (Status s = send_all(conn.get(), std::as_bytes(std::span(request)), deadline); !s.ok()) {
    return unreachable(s);
  }
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
    const std::string answer =
        frame_string(HandshakeFrame::kProof,
                     std::string_view(reinterpret_cast<const char*>(proof.data()), proof.size()));
    if (Status s = send_all(conn.get(), std::as_bytes(std::span(answer)), deadline); !s.ok()) {
      return unreachable(s);
    }
    if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return unreachable(s);
    header = decode_handshake_header(header_bytes, kMaxDescriptorBytes);
    if (!header.ok()) return unreachable(header.status());
    proved = true;
  } else if (secret) {
    return Unauthenticated("peer " + endpoint.to_string() +
                           " served its descriptor without asking for the secret, and this "
                           "engine holds one: a peer that does not ask is not one of ours");
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
  if (secret) {
    AuthProof signature{};
    if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return unreachable(s);
    auto proof = decode_handshake_header(header_bytes, sizeof(AuthProof));
    if (!proof.ok() || proof->type != HandshakeFrame::kProof ||
        proof->length != sizeof(AuthProof)) {
      return Unauthenticated("peer " + endpoint.to_string() +
                             " sent its descriptor without proving the secret");
    }
    if (Status s = recv_all(conn.get(), signature, deadline); !s.ok()) return unreachable(s);
    if (!auth_proof_matches(descriptor_signature(*secret, client_nonce, payload), signature)) {
      return Unauthenticated("peer " + endpoint.to_string() +
                             " proved another secret over its descriptor");
    }
  }
  return payload;
}

}  // namespace kvferry
