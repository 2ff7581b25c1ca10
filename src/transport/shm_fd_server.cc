#include "transport/shm_fd_server.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/auth.h"
#include "core/byte_codec.h"
#include "core/frame_header.h"
#include "core/logging.h"

namespace kvferry {
namespace {

constexpr FrameFormat kShmFdFormat{"shm fd", kShmFdMagic, kShmFdVersion,
                                   static_cast<uint16_t>(ShmFdFrame::kReply)};
constexpr uint32_t kMaxRequestBytes = sizeof(AuthProof) + sizeof(uint64_t);
constexpr uint32_t kMaxReplyBytes = 4096;

std::vector<std::byte> frame(ShmFdFrame type, std::span<const std::byte> payload) {
  return make_frame(kShmFdFormat, static_cast<uint16_t>(type), payload);
}

std::vector<std::byte> reply_frame(const Status& status) {
  ByteWriter w;
  w.put(static_cast<uint8_t>(status.code()));
  const std::string& message = status.message();
  const size_t n = std::min<size_t>(message.size(), kMaxReplyBytes - 1);
  w.bytes().insert(w.bytes().end(), reinterpret_cast<const std::byte*>(message.data()),
                   reinterpret_cast<const std::byte*>(message.data()) + n);
  return frame(ShmFdFrame::kReply, w.bytes());
}

}  // namespace

Result<std::unique_ptr<ShmFdServer>> ShmFdServer::start(uint64_t incarnation, Lookup lookup,
                                                        std::optional<std::string> secret,
                                                        std::chrono::milliseconds io_timeout) {
  std::string name = fmt::format("kvferry-shm/{}/{:016x}", ::getpid(), incarnation);
  KVF_ASSIGN_OR_RETURN(Fd listener, listen_abstract(name, 64));
  Acceptor::Options accepting = Acceptor::Options::named("shm fd", SOCK_NONBLOCK);
  accepting.limits.max_connections = kMaxConnections;
  accepting.limits.max_connections_per_source = 0;  // every client is "" (a Unix socket)
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<Acceptor> acceptor,
                       Acceptor::adopt(std::move(listener), "@" + name, std::move(accepting)));
  std::unique_ptr<ShmFdServer> server(new ShmFdServer(
      std::move(acceptor), std::move(name), std::move(lookup), std::move(secret), io_timeout));
  KVF_RETURN_IF_ERROR(server->acceptor_->start([s = server.get()](Fd fd, ConnectionSlot slot) {
    const auto deadline = Clock::now() + s->io_timeout_;  // from accept: queued time counts
    auto held = std::make_shared<std::pair<Fd, ConnectionSlot>>(std::move(fd), std::move(slot));
    // Not served (no thread): the connection closes, and the peer reaches this engine by
    // its next route.
    (void)s->pool_.post([s, held, deadline] { s->serve(std::move(held->first), deadline); });
  }));
  return server;
}

ShmFdServer::ShmFdServer(std::unique_ptr<Acceptor> acceptor, std::string name, Lookup lookup,
                         std::optional<std::string> secret, std::chrono::milliseconds io_timeout)
    : name_(std::move(name)),
      lookup_(std::move(lookup)),
      secret_(std::move(secret)),
      io_timeout_(io_timeout),
      pool_(kThreads, "kvf-shm-fd", ThreadPool::Start::kOnDemand),
      acceptor_(std::move(acceptor)) {}

ShmFdServer::~ShmFdServer() { acceptor_->stop(); }  // then the pool runs what is queued

void ShmFdServer::serve(Fd connection, Clock::time_point deadline) {
  if (Clock::now() >= deadline) return;  // waited out its time in the queue
  AuthNonce nonce{};
  if (secret_) {
    Result<AuthNonce> fresh = make_auth_nonce();
    if (!fresh.ok()) return;
    nonce = *fresh;
  }
  std::span<const std::byte> challenge =
      secret_ ? std::span<const std::byte>(nonce) : std::span<const std::byte>();
  if (!send_all(connection.get(), frame(ShmFdFrame::kChallenge, challenge), deadline).ok()) return;
  std::byte header_bytes[kFrameHeaderBytes];
  if (!recv_all(connection.get(), header_bytes, deadline).ok()) return;
  auto header = decode_frame_header(kShmFdFormat, header_bytes, kMaxRequestBytes);
  const uint32_t expected = (secret_ ? sizeof(AuthProof) : 0) + sizeof(uint64_t);
  if (!header.ok() || header->type != static_cast<uint16_t>(ShmFdFrame::kRequest) ||
      header->payload_bytes != expected) {
    send_all(connection.get(), reply_frame(ProtocolError("shm fd: expected a Request")), deadline)
        .ignore();
    return;
  }
  std::vector<std::byte> payload(expected);
  if (!recv_all(connection.get(), payload, deadline).ok()) return;
  Status refused;
  if (secret_) {
    if (!auth_proof_matches(auth_proof(*secret_, nonce),
                            std::span<const std::byte>(payload).first(sizeof(AuthProof)))) {
      refused = Unauthenticated("wrong secret");
    }
  } else {
    ucred peer{};
    socklen_t length = sizeof(peer);
    if (::getsockopt(connection.get(), SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
      refused = ErrnoStatus(StatusCode::kInternal, "SO_PEERCRED", errno);
    } else if (peer.uid != ::geteuid() && peer.uid != 0) {
      refused = Unauthenticated(
          fmt::format("uid {} (pid {}) may not map the shared memory of uid {} without a secret "
                      "(set the same KVFERRY_SECRET on both engines)",
                      peer.uid, peer.pid, ::geteuid()));
    }
  }
  const auto inode = load_le<uint64_t>(payload.data() + (expected - sizeof(uint64_t)));
  if (!refused.ok()) {
    log().warn("shm fd: refused a peer: {}", refused.message());
    send_all(connection.get(), reply_frame(refused), deadline).ignore();
    return;
  }
  Fd memfd = lookup_(inode);
  if (!memfd.valid()) {
    send_all(connection.get(),
             reply_frame(PeerDisconnected("no shared allocation with inode " +
                                          std::to_string(inode) + " (freed?)")),
             deadline)
        .ignore();
    return;
  }
  send_with_fd(connection.get(), reply_frame(Status::Ok()), memfd.get(), deadline).ignore();
}

Result<Fd> fetch_shm_fd(const std::string& name, int64_t expected_pid, uint64_t inode,
                        const std::optional<std::string>& secret, Clock::time_point deadline) {
  const std::string where = "shm socket @" + name;
  Result<Fd> connected = connect_abstract(name, "the peer's shm socket");
  if (!connected.ok()) {
    // The caller takes the next route for NotSupported (transport/shm_fd_server.h).
    const StatusCode code = connected.status().code() == StatusCode::kPeerUnreachable
                                ? StatusCode::kNotSupported
                                : connected.status().code();
    return Status(code, connected.status().message());
  }
  Fd conn = std::move(*connected);
  // The memory is that of whoever listens there, as the kernel says: it must be the process
  // the descriptor names.
  ucred owner{};
  socklen_t owner_length = sizeof(owner);
  if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &owner, &owner_length) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "SO_PEERCRED of " + where, errno);
  }
  if (owner.pid != expected_pid) {
    return Unauthenticated(fmt::format(
        "the peer's descriptor names pid {}, but the process listening on its {} is pid {} "
        "(uid {}), as the kernel reports it",
        expected_pid, where, owner.pid, owner.uid));
  }
  std::byte header_bytes[kFrameHeaderBytes];
  KVF_RETURN_IF_ERROR(recv_all(conn.get(), header_bytes, deadline));
  KVF_ASSIGN_OR_RETURN(FrameHeader challenge,
                       decode_frame_header(kShmFdFormat, header_bytes, sizeof(AuthNonce)));
  if (challenge.type != static_cast<uint16_t>(ShmFdFrame::kChallenge) ||
      (challenge.payload_bytes != 0 && challenge.payload_bytes != sizeof(AuthNonce))) {
    return ProtocolError(where + ": expected a Challenge");
  }
  if (challenge.payload_bytes == 0 && secret) {
    return Unauthenticated(where +
                           " sent no challenge, and this engine holds a secret: a peer that "
                           "does not ask for the secret is not one of ours");
  }
  std::vector<std::byte> request;
  if (challenge.payload_bytes != 0) {
    AuthNonce nonce{};
    KVF_RETURN_IF_ERROR(recv_all(conn.get(), nonce, deadline));
    if (!secret) {
      return Unauthenticated(
          "the peer's shared memory requires the secret; none is configured "
          "here (EngineOptions::secret or KVFERRY_SECRET)");
    }
    AuthProof proof = auth_proof(*secret, nonce);
    request.insert(request.end(), proof.begin(), proof.end());
  }
  request.resize(request.size() + sizeof(inode));
  store_le(request.data() + request.size() - sizeof(inode), inode);
  KVF_RETURN_IF_ERROR(send_all(conn.get(), frame(ShmFdFrame::kRequest, request), deadline));
  Fd received;
  KVF_RETURN_IF_ERROR(recv_with_fd(conn.get(), header_bytes, received, deadline));
  KVF_ASSIGN_OR_RETURN(FrameHeader reply,
                       decode_frame_header(kShmFdFormat, header_bytes, kMaxReplyBytes));
  if (reply.type != static_cast<uint16_t>(ShmFdFrame::kReply) || reply.payload_bytes == 0) {
    return ProtocolError(where + ": expected a Reply");
  }
  std::vector<std::byte> payload(reply.payload_bytes);
  KVF_RETURN_IF_ERROR(recv_with_fd(conn.get(), payload, received, deadline));
  const auto code = static_cast<uint8_t>(payload[0]);
  if (!is_valid_status_code(code))
    return ProtocolError(where + ": status code " + std::to_string(code));
  if (code != 0) {
    return Status(
        static_cast<StatusCode>(code),
        "the peer refused its shared memory: " +
            std::string(reinterpret_cast<const char*>(payload.data()) + 1, payload.size() - 1));
  }
  if (!received.valid()) return ProtocolError(where + ": OK without a descriptor attached");
  return received;
}

}  // namespace kvferry
