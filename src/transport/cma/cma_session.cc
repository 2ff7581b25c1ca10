#include "transport/cma/cma_session.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/auth.h"
#include "core/byte_codec.h"
#include "core/frame_header.h"
#include "core/logging.h"
#include "core/named_thread.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77  // Linux 6.5: a pidfd of the peer's process, race-free
#endif

namespace kvferry {
namespace {

constexpr size_t kAckFrameBytes = kFrameHeaderBytes + sizeof(uint64_t);
// What an unauthenticated connection may send: one Open frame with a proof.
constexpr size_t kMaxOpenBytes = kFrameHeaderBytes + sizeof(AuthProof);
// An initiator sends nothing but Acks once its session is open.
constexpr size_t kMaxTargetInbox = 64 * kAckFrameBytes;
constexpr auto kAcceptBackoff = std::chrono::milliseconds(50);

std::vector<CmaRange> to_ranges(const std::map<uint64_t, uint64_t>& set) {
  std::vector<CmaRange> out;
  out.reserve(set.size());
  for (const auto& [addr, length] : set) out.push_back({addr, length});
  return out;
}

}  // namespace

struct CmaSessionHub::Connection {
  Fd fd;
  ucred peer{};
  AuthNonce nonce{};
  bool challenged = false;
  Clock::time_point open_deadline;
  std::vector<std::byte> inbox;  // hub thread only
  std::mutex send_mu;            // one frame at a time, in the order they were decided
  // Guarded by the hub's mu_:
  bool session = false;  // Declare sent (or being sent): Add and Revoke frames follow it
  bool closed = false;
  uint64_t acked = 0;
};

Result<std::unique_ptr<CmaSessionHub>> CmaSessionHub::start(Options options) {
  std::string name = fmt::format("kvferry-cma/{}/{:016x}", ::getpid(), options.incarnation);
  KVF_ASSIGN_OR_RETURN(Fd listener, listen_abstract(name, 128));
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return ErrnoStatus(StatusCode::kInternal, "cma session: eventfd", errno);
  std::unique_ptr<CmaSessionHub> hub(
      new CmaSessionHub(std::move(listener), std::move(wake), std::move(name), std::move(options)));
  KVF_ASSIGN_OR_RETURN(hub->thread_, start_named_thread("kvf-cma", [h = hub.get()] { h->loop(); }));
  return hub;
}

CmaSessionHub::CmaSessionHub(Fd listener, Fd wake, std::string name, Options options)
    : listener_(std::move(listener)),
      wake_(std::move(wake)),
      name_(std::move(name)),
      options_(std::move(options)) {}

CmaSessionHub::~CmaSessionHub() {
  stopping_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  for (const auto& [key, peer] : initiators_) peer->close("this engine is shutting down");
}

void CmaSessionHub::wake() const {
  uint64_t one = 1;
  if (::write(wake_.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
    log().warn("cma session: cannot wake the hub thread: {}", std::strerror(errno));
  }
}

size_t CmaSessionHub::sessions() const {
  std::lock_guard lock(mu_);
  return static_cast<size_t>(std::count_if(targets_.begin(), targets_.end(),
                                           [](const auto& c) { return c->session && !c->closed; }));
}

void CmaSessionHub::loop() {
  ::pthread_setname_np(::pthread_self(), "kvf-cma");
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<Connection>> targets;
  std::vector<std::shared_ptr<CmaVerifiedPeer>> initiators;
  while (!stopping_.load()) {
    int timeout_ms = -1;
    {
      std::lock_guard lock(mu_);
      erase_closed();
      targets = targets_;
      initiators.clear();
      for (const auto& entry : initiators_) initiators.push_back(entry.second);
      const auto now = Clock::now();
      for (const auto& c : targets) {
        if (c->session) continue;
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(c->open_deadline - now);
        const int ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, 1 << 30));
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }
    const auto resume_accepting =
        std::chrono::ceil<std::chrono::milliseconds>(accept_paused_until_ - Clock::now());
    const bool accepting = resume_accepting.count() <= 0;
    if (!accepting) {
      const int ms = static_cast<int>(resume_accepting.count());
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    }
    fds.clear();
    fds.push_back({wake_.get(), POLLIN, 0});
    fds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});  // poll skips a negative fd
    for (const auto& c : targets) fds.push_back({c->fd.get(), POLLIN, 0});
    for (const auto& p : initiators) fds.push_back({p->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      log().error("cma session: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[0].revents != 0) {
      uint64_t count = 0;
      while (::read(wake_.get(), &count, sizeof(count)) > 0) {
      }
    }
    if (fds[1].revents != 0) accept_ready();
    for (size_t i = 0; i < targets.size(); ++i) {
      if (fds[2 + i].revents != 0) read_connection(targets[i]);
    }
    for (size_t i = 0; i < initiators.size(); ++i) {
      if (fds[2 + targets.size() + i].revents != 0) initiators[i]->drain();
    }
    // Unauthenticated connections get io_timeout from accept to their Open.
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    for (const auto& c : targets) {
      if (!c->session && !c->closed && now >= c->open_deadline) {
        c->closed = true;
        ::shutdown(c->fd.get(), SHUT_RDWR);
      }
    }
  }
}

void CmaSessionHub::erase_closed() {
  std::erase_if(targets_, [](const auto& c) { return c->closed; });
  std::erase_if(initiators_, [](const auto& entry) { return entry.second->closed(); });
}

void CmaSessionHub::accept_ready() {
  for (;;) {
    Fd conn(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) {
      // Out of descriptors or memory: the listener stays readable, so it is left out of the
      // poll set for a while instead of spinning on it.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        accept_paused_until_ = Clock::now() + kAcceptBackoff;
      }
      return;
    }
    auto c = std::make_shared<Connection>();
    c->fd = std::move(conn);
    socklen_t length = sizeof(c->peer);
    if (::getsockopt(c->fd.get(), SOL_SOCKET, SO_PEERCRED, &c->peer, &length) != 0) continue;
    {
      std::lock_guard lock(mu_);
      const auto pending = std::count_if(targets_.begin(), targets_.end(),
                                         [](const auto& t) { return !t->session; });
      if (static_cast<size_t>(pending) >= kMaxPendingOpens || targets_.size() >= kMaxConnections) {
        log().debug("cma session: closed a connection from pid {}: {} are waiting to open",
                    c->peer.pid, pending);
        continue;  // closes it
      }
    }
    std::span<const std::byte> challenge;
    if (options_.secret) {
      Result<AuthNonce> nonce = make_auth_nonce();
      if (!nonce.ok()) continue;
      c->nonce = *nonce;
      c->challenged = true;
      challenge = c->nonce;
    }
    if (!send_now(c->fd.get(), make_cma_frame(CmaSessionFrame::kChallenge, challenge))) continue;
    c->open_deadline = Clock::now() + options_.io_timeout;
    std::lock_guard lock(mu_);
    targets_.push_back(std::move(c));
  }
}

void CmaSessionHub::read_connection(const std::shared_ptr<Connection>& c) {
  bool session = false;
  {
    std::lock_guard lock(mu_);
    if (c->closed) return;
    session = c->session;
  }
  std::string why;
  const bool open =
      receive_available(c->fd.get(), c->inbox, session ? kMaxTargetInbox : kMaxOpenBytes, why);
  size_t at = 0;
  uint64_t acked = 0;
  while (open && c->inbox.size() - at >= kFrameHeaderBytes) {
    auto header = decode_frame_header(
        kCmaSessionFormat, std::span<const std::byte>(c->inbox).subspan(at, kFrameHeaderBytes),
        sizeof(AuthProof));
    if (!header.ok()) {
      why = header.status().message();
      break;
    }
    if (c->inbox.size() - at - kFrameHeaderBytes < header->payload_bytes) break;
    const auto payload =
        std::span<const std::byte>(c->inbox).subspan(at + kFrameHeaderBytes, header->payload_bytes);
    at += kFrameHeaderBytes + header->payload_bytes;
    const auto type = static_cast<CmaSessionFrame>(header->type);
    if (!session && type == CmaSessionFrame::kOpen) {
      const size_t expected = c->challenged ? sizeof(AuthProof) : 0;
      Status refused;
      if (payload.size() != expected) {
        refused = ProtocolError(
            fmt::format("an Open of {} bytes (expected {})", payload.size(), expected));
      } else if (c->challenged) {
        if (!auth_proof_matches(auth_proof(*options_.secret, c->nonce), payload)) {
          refused = Unauthenticated("wrong secret");
        }
      } else if (c->peer.uid != ::geteuid() && c->peer.uid != 0) {
        refused = Unauthenticated(fmt::format(
            "uid {} (pid {}) may not attach to the memory of uid {} without a secret (set the "
            "same KVFERRY_SECRET on both engines)",
            c->peer.uid, c->peer.pid, ::geteuid()));
      }
      if (!refused.ok()) {
        log().warn("cma session: refused pid {}: {}", c->peer.pid, refused.message());
        send_now(c->fd.get(), cma_declare_frame(refused, 0, {}));
        why = refused.message();
        break;
      }
      finish_open(c);
      session = true;
    } else if (session && type == CmaSessionFrame::kAck && payload.size() == sizeof(uint64_t)) {
      acked = std::max(acked, load_le<uint64_t>(payload.data()));
    } else {
      why = fmt::format("unexpected frame type {} of {} bytes", header->type, payload.size());
      break;
    }
  }
  c->inbox.erase(c->inbox.begin(), c->inbox.begin() + static_cast<std::ptrdiff_t>(at));
  std::lock_guard lock(mu_);
  c->acked = std::max(c->acked, acked);
  if (!why.empty() || !open) {
    c->closed = true;
    ::shutdown(c->fd.get(), SHUT_RDWR);
  }
  acked_.notify_all();
}

void CmaSessionHub::finish_open(const std::shared_ptr<Connection>& c) {
  // The Declare is decided and sent under send_mu: an Add decided after the snapshot is
  // sent after it, and one decided before is in it.
  std::lock_guard send_lock(c->send_mu);
  std::vector<CmaRange> ranges;
  {
    std::lock_guard lock(mu_);
    ranges = to_ranges(declared_);
    c->session = true;
  }
  Status sent = send_all(c->fd.get(), cma_declare_frame(Status::Ok(), options_.incarnation, ranges),
                         Clock::now() + options_.io_timeout);
  if (!sent.ok()) {
    std::lock_guard lock(mu_);
    c->closed = true;
    ::shutdown(c->fd.get(), SHUT_RDWR);
  }
}

void CmaSessionHub::declare(CmaRange range) {
  std::vector<std::shared_ptr<Connection>> sessions;
  {
    std::lock_guard lock(mu_);
    declared_[range.addr] = range.length;
    for (const auto& c : targets_) {
      if (c->session && !c->closed) sessions.push_back(c);
    }
  }
  if (sessions.empty()) return;
  ByteWriter w;
  put_cma_ranges(w, {&range, 1});
  const std::vector<std::byte> frame = make_cma_frame(CmaSessionFrame::kAdd, w.bytes());
  for (const auto& c : sessions) {
    std::lock_guard send_lock(c->send_mu);
    if (!send_all(c->fd.get(), frame, Clock::now() + options_.io_timeout).ok()) {
      std::lock_guard lock(mu_);
      c->closed = true;
      ::shutdown(c->fd.get(), SHUT_RDWR);
    }
  }
}

size_t CmaSessionHub::revoke(std::span<const CmaRange> ranges) {
  if (ranges.empty()) return 0;
  // One revocation at a time: an Ack covers every Revoke frame up to its sequence only if the
  // frames went out in sequence order on every connection.
  std::lock_guard one_at_a_time(revoke_mu_);
  // One frame per bounded slice of ranges, each with its own sequence; the last one's Ack
  // covers them all (an initiator applies frames in order).
  constexpr size_t kRangesPerFrame = (kMaxCmaFrameBytes - 16) / kCmaRangeBytes;
  const size_t frame_count = (ranges.size() + kRangesPerFrame - 1) / kRangesPerFrame;
  std::vector<std::shared_ptr<Connection>> sessions;
  uint64_t sequence = 0;
  {
    std::lock_guard lock(mu_);
    for (const CmaRange& r : ranges) declared_.erase(r.addr);
    for (const auto& c : targets_) {
      if (c->session && !c->closed) sessions.push_back(c);
    }
    if (sessions.empty()) return 0;
    sequence = revoke_sequence_;
    revoke_sequence_ += frame_count;
  }
  const auto deadline = Clock::now() + options_.io_timeout;
  std::vector<std::vector<std::byte>> frames;
  for (size_t at = 0; at < ranges.size(); at += kRangesPerFrame) {
    ByteWriter w;
    w.put(++sequence);
    put_cma_ranges(w, ranges.subspan(at, std::min(kRangesPerFrame, ranges.size() - at)));
    frames.push_back(make_cma_frame(CmaSessionFrame::kRevoke, w.bytes()));
  }
  for (const auto& c : sessions) {
    std::lock_guard send_lock(c->send_mu);
    for (const auto& frame : frames) {
      if (!send_all(c->fd.get(), frame, deadline).ok()) {
        std::lock_guard lock(mu_);
        c->closed = true;
        ::shutdown(c->fd.get(), SHUT_RDWR);
        break;
      }
    }
  }
  std::unique_lock lock(mu_);
  acked_.wait_until(lock, deadline, [&] {
    return std::all_of(sessions.begin(), sessions.end(),
                       [&](const auto& c) { return c->closed || c->acked >= sequence; });
  });
  size_t cut = 0;
  for (const auto& c : sessions) {
    if (c->closed || c->acked >= sequence) continue;
    // It did not answer in time: cut off. An honest initiator fails every copy once its hub
    // reads the shutdown; one whose process is stopped cannot copy meanwhile either.
    c->closed = true;
    ::shutdown(c->fd.get(), SHUT_RDWR);
    ++cut;
    log().warn(
        "cma session: pid {} did not acknowledge an unregistration within {} ms: cut off (its "
        "later cma copies to this engine fail)",
        c->peer.pid, options_.io_timeout.count());
  }
  if (cut > 0) wake();
  return cut;
}

Result<std::shared_ptr<CmaVerifiedPeer>> CmaSessionHub::open(
    const std::string& socket_name, const std::string& peer_name, int64_t claimed_pid,
    uint64_t claimed_incarnation, std::shared_ptr<PeerLiveness> liveness) {
  const std::string where = fmt::format("peer {}'s cma socket @{}", peer_name, socket_name);
  KVF_ASSIGN_OR_RETURN(
      Fd conn, connect_abstract(socket_name, fmt::format("peer {}'s cma socket", peer_name)));
  // Who listens there, as the kernel says: not what the descriptor claims.
  ucred peer{};
  socklen_t length = sizeof(peer);
  if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "SO_PEERCRED of " + where, errno);
  }
  if (peer.pid != claimed_pid) {
    return Unauthenticated(
        fmt::format("cma: peer {}'s descriptor names pid {}, but the process listening on its "
                    "cma socket @{} is pid {} (uid {}), as the kernel reports it",
                    peer_name, claimed_pid, socket_name, peer.pid, peer.uid));
  }
  Fd pidfd;
  int received = -1;
  length = sizeof(received);
  if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERPIDFD, &received, &length) == 0) {
    pidfd = Fd(received);
  } else {
    pidfd = Fd(static_cast<int>(::syscall(SYS_pidfd_open, peer.pid, 0)));  // -1: no pidfd here
  }
  const auto deadline = Clock::now() + options_.io_timeout;
  auto failed = [&](const Status& s) {
    return Status(
        s.code() == StatusCode::kTimeout ? StatusCode::kTimeout : StatusCode::kPeerUnreachable,
        where + ": " + s.message());
  };
  std::byte header_bytes[kFrameHeaderBytes];
  if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return failed(s);
  KVF_ASSIGN_OR_RETURN(FrameHeader challenge,
                       decode_frame_header(kCmaSessionFormat, header_bytes, sizeof(AuthNonce)));
  if (challenge.type != static_cast<uint16_t>(CmaSessionFrame::kChallenge) ||
      (challenge.payload_bytes != 0 && challenge.payload_bytes != sizeof(AuthNonce))) {
    return ProtocolError(where + ": expected a Challenge");
  }
  std::vector<std::byte> proof;
  if (challenge.payload_bytes == 0 && options_.secret) {
    return Unauthenticated(
        where +
        " sent no challenge, and this engine holds a secret: a peer that does not ask "
        "for the secret is not one of ours");
  }
  if (challenge.payload_bytes != 0) {
    AuthNonce nonce{};
    if (Status s = recv_all(conn.get(), nonce, deadline); !s.ok()) return failed(s);
    if (!options_.secret) {
      return Unauthenticated(where +
                             " requires the secret; none is configured here "
                             "(EngineOptions::secret or KVFERRY_SECRET)");
    }
    AuthProof p = auth_proof(*options_.secret, nonce);
    proof.assign(p.begin(), p.end());
  }
  if (Status s = send_all(conn.get(), make_cma_frame(CmaSessionFrame::kOpen, proof), deadline);
      !s.ok()) {
    return failed(s);
  }
  if (Status s = recv_all(conn.get(), header_bytes, deadline); !s.ok()) return failed(s);
  KVF_ASSIGN_OR_RETURN(FrameHeader declare,
                       decode_frame_header(kCmaSessionFormat, header_bytes, kMaxCmaFrameBytes));
  if (declare.type != static_cast<uint16_t>(CmaSessionFrame::kDeclare) ||
      declare.payload_bytes == 0) {
    return ProtocolError(where + ": expected a Declare");
  }
  std::vector<std::byte> payload(declare.payload_bytes);
  if (Status s = recv_all(conn.get(), payload, deadline); !s.ok()) return failed(s);
  ByteReader r(payload);
  uint8_t code = 0;
  r.get(code);
  if (!is_valid_status_code(code)) {
    return ProtocolError(where + ": status code " + std::to_string(code));
  }
  if (code != 0) {
    std::string message;
    r.get_string(message, 1024);
    return Status(static_cast<StatusCode>(code), where + " refused a session: " + message);
  }
  uint64_t incarnation = 0;
  std::vector<CmaRange> ranges;
  if (!r.get(incarnation) || !get_cma_ranges(r, ranges) || r.remaining() != 0) {
    return ProtocolError(where + ": a malformed Declare");
  }
  if (incarnation != claimed_incarnation) {
    return Unauthenticated(fmt::format(
        "cma: peer {}'s descriptor names incarnation {:016x}, but pid {} on its cma socket is "
        "incarnation {:016x}",
        peer_name, claimed_incarnation, peer.pid, incarnation));
  }
  if (::fcntl(conn.get(), F_SETFL, ::fcntl(conn.get(), F_GETFL) | O_NONBLOCK) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "O_NONBLOCK on " + where, errno);
  }
  auto verified = std::make_shared<CmaVerifiedPeer>(std::move(conn), peer.pid, std::move(pidfd),
                                                    peer_name, ranges, std::move(liveness));
  {
    std::lock_guard lock(mu_);
    initiators_.emplace_back(claimed_incarnation, verified);
  }
  wake();
  return verified;
}

void CmaSessionHub::forget(uint64_t incarnation) {
  std::lock_guard lock(mu_);
  for (const auto& [key, peer] : initiators_) {
    if (key == incarnation) peer->close("the peer is gone from this engine");
  }
  wake();
}

}  // namespace kvferry
