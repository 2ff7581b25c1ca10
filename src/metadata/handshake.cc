#include "metadata/handshake.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/logging.h"
#include "metadata/segment_descriptor.h"

namespace kvferry {
namespace {

constexpr size_t kMaxRequestPayload = 4096;

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
  auto type = static_cast<uint16_t>(h.type);
  std::memcpy(out, &h.magic, 4);
  std::memcpy(out + 4, &h.version, 2);
  std::memcpy(out + 6, &type, 2);
  std::memcpy(out + 8, &h.length, 4);
}

Result<HandshakeHeader> decode_handshake_header(const std::byte* in, size_t max_length) {
  HandshakeHeader h;
  uint16_t type = 0;
  std::memcpy(&h.magic, in, 4);
  std::memcpy(&h.version, in + 4, 2);
  std::memcpy(&type, in + 6, 2);
  std::memcpy(&h.length, in + 8, 4);
  if (h.magic != kHandshakeMagic) {
    return ProtocolError("handshake: bad magic " + std::to_string(h.magic) +
                         " (not a kvferry peer?)");
  }
  if (h.version != kHandshakeVersion) {
    return ProtocolError("handshake: unsupported version " + std::to_string(h.version));
  }
  if (type < 1 || type > 3)
    return ProtocolError("handshake: unknown frame type " + std::to_string(type));
  h.type = static_cast<HandshakeFrame>(type);
  if (h.length > max_length) {
    return ProtocolError("handshake: payload of " + std::to_string(h.length) +
                         " bytes exceeds the limit of " + std::to_string(max_length));
  }
  return h;
}

Result<std::unique_ptr<HandshakeServer>> HandshakeServer::start(
    const Endpoint& listen, DescriptorSource source, std::chrono::milliseconds io_timeout,
    int threads) {
  Endpoint bound;
  KVF_ASSIGN_OR_RETURN(Fd listener, listen_tcp(listen, &bound));
  return std::unique_ptr<HandshakeServer>(
      new HandshakeServer(std::move(listener), bound, std::move(source), io_timeout, threads));
}

HandshakeServer::HandshakeServer(Fd listener, Endpoint bound, DescriptorSource source,
                                 std::chrono::milliseconds io_timeout, int threads)
    : listener_(std::move(listener)),
      wake_(::eventfd(0, EFD_CLOEXEC)),
      bound_(std::move(bound)),
      source_(std::move(source)),
      io_timeout_(io_timeout),
      pool_(threads) {
  acceptor_ = std::thread([this] { accept_loop(); });
}

HandshakeServer::~HandshakeServer() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  acceptor_.join();
}

void HandshakeServer::accept_loop() {
  for (;;) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0 || (fds[1].revents & POLLIN) != 0) return;
    int conn = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // Each connection is served on the pool, so one slow client never blocks others;
    // every read and write is bounded by io_timeout_.
    auto holder = std::make_shared<Fd>(conn);
    pool_.post([this, holder] { serve(std::move(*holder)); });
  }
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
    reply = make_frame(HandshakeFrame::kDescriptor, source_());
  }
  send_all(connection.get(), reply, deadline).ignore();
}

Result<std::string> fetch_descriptor(const Endpoint& endpoint, Clock::time_point deadline) {
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
  std::string payload(header->length, '\0');
  std::span<std::byte> payload_bytes(reinterpret_cast<std::byte*>(payload.data()), payload.size());
  if (Status s = recv_all(conn.get(), payload_bytes, deadline); !s.ok()) return unreachable(s);
  if (header->type == HandshakeFrame::kError) {
    return ProtocolError("handshake with " + endpoint.to_string() + " refused: " + payload);
  }
  if (header->type != HandshakeFrame::kDescriptor) {
    return ProtocolError("handshake with " + endpoint.to_string() + ": unexpected frame type");
  }
  return payload;
}

}  // namespace kvferry
