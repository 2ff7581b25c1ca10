#include "transport/cma/cma_verified_peer.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <iterator>

namespace kvferry {
namespace {

constexpr auto kExitShowsWithin = std::chrono::milliseconds(100);

}  // namespace

WriterPreferringLock::WriterPreferringLock() {
  pthread_rwlockattr_t attributes;
  ::pthread_rwlockattr_init(&attributes);
  ::pthread_rwlockattr_setkind_np(&attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  ::pthread_rwlock_init(&lock_, &attributes);
  ::pthread_rwlockattr_destroy(&attributes);
}

WriterPreferringLock::~WriterPreferringLock() { ::pthread_rwlock_destroy(&lock_); }

CmaVerifiedPeer::CmaVerifiedPeer(Fd connection, pid_t pid, Fd pidfd, std::string peer_name,
                                 const std::vector<CmaRange>& declared,
                                 std::shared_ptr<PeerLiveness> liveness)
    : connection_(std::move(connection)),
      pid_(pid),
      pidfd_(std::move(pidfd)),
      peer_name_(std::move(peer_name)),
      liveness_(std::move(liveness)) {
  for (const CmaRange& r : declared) declared_[r.addr] = r.length;
}

bool CmaVerifiedPeer::covered_locked(uint64_t addr, uint64_t length) const {
  auto it = declared_.upper_bound(addr);
  if (it == declared_.begin()) return false;
  --it;
  const uint64_t end = addr + length;
  uint64_t at = addr;
  // Adjacent declared ranges cover a range that crosses from one into the next.
  while (it != declared_.end() && it->first <= at) {
    const uint64_t range_end = it->first + it->second;
    if (range_end >= end) return true;
    if (range_end <= at) return false;
    at = range_end;
    ++it;
  }
  return false;
}

Status CmaVerifiedPeer::admit_locked(std::span<const iovec> remote) const {
  if (!closed_why_.empty()) {
    return PeerDisconnected(fmt::format("cma: the session with peer {} (pid {}) is closed: {}",
                                        peer_name_, pid_, closed_why_));
  }
  // A chunk's ranges come in the peer's address order, mostly inside one declared range: the
  // last range found covers the next ones with two compares, and only a range outside it is
  // looked up in the map.
  uint64_t known_begin = 0;
  uint64_t known_end = 0;
  for (const iovec& v : remote) {
    const auto addr = reinterpret_cast<uint64_t>(v.iov_base);
    if (addr >= known_begin && addr <= known_end && v.iov_len <= known_end - addr) continue;
    if (auto it = declared_.upper_bound(addr); it != declared_.begin()) {
      --it;
      known_begin = it->first;
      known_end = it->first + it->second;
    }
    if (!covered_locked(addr, v.iov_len)) {
      return NotRegistered(fmt::format(
          "cma: [{:#x}, +{}) of peer {} (pid {}) is not among the ranges it declared over its "
          "cma session (never registered there, or unregistered)",
          addr, v.iov_len, peer_name_, pid_));
    }
  }
  return Status::Ok();
}

bool CmaVerifiedPeer::declares(uint64_t addr, uint64_t length) const {
  std::shared_lock lock(lock_);
  return covered_locked(addr, length);
}

std::optional<uint64_t> CmaVerifiedPeer::first_address() const {
  std::shared_lock lock(lock_);
  if (declared_.empty()) return std::nullopt;
  return declared_.begin()->first;
}

bool CmaVerifiedPeer::closed() const {
  std::shared_lock lock(lock_);
  return !closed_why_.empty();
}

void CmaVerifiedPeer::close(const std::string& why, bool tell_peer) {
  std::unique_lock lock(lock_);
  close_locked(why, tell_peer);
}

void CmaVerifiedPeer::close_locked(const std::string& why, bool tell_peer) {
  if (!closed_why_.empty()) return;
  closed_why_ = why;
  ::shutdown(connection_.get(), SHUT_RDWR);
  inbox_.clear();
  if (!liveness_ || !tell_peer) return;
  // A session closes when its target's process exits too: say so, as the engine's pidfd
  // monitor would (whichever notices first names the cause).
  pollfd exited{pidfd_.get(), POLLIN, 0};
  if (pidfd_.valid() && ::poll(&exited, 1, 0) == 1) {
    liveness_->mark_disconnected(fmt::format("process {} exited", pid_));
  } else {
    liveness_->mark_disconnected("its cma session closed: " + why);
  }
}

void CmaVerifiedPeer::drain() {
  // Exclusive: waits for the copies in flight, so that a Revoke applied here is one no copy
  // can still be writing into when the Ack goes out.
  std::unique_lock lock(lock_);
  for (;;) {
    if (!closed_why_.empty()) return;
    const size_t before = inbox_.size();
    std::string why;
    const bool open =
        receive_available(connection_.get(), inbox_, kFrameHeaderBytes + kMaxCmaFrameBytes, why);
    const bool received = inbox_.size() > before;
    apply_frames_locked();
    if (!open) {
      // A process's sockets close before its pidfd reports the exit: give an exit in progress
      // a moment to show, so the peer is said to have exited rather than to have hung up.
      pollfd exiting{pidfd_.get(), POLLIN, 0};
      if (pidfd_.valid()) ::poll(&exiting, 1, static_cast<int>(kExitShowsWithin.count()));
      return close_locked(why);
    }
    if (!received) return;
  }
}

void CmaVerifiedPeer::apply_frames_locked() {
  size_t at = 0;
  while (closed_why_.empty() && inbox_.size() - at >= kFrameHeaderBytes) {
    auto header = decode_frame_header(
        kCmaSessionFormat, std::span<const std::byte>(inbox_).subspan(at, kFrameHeaderBytes),
        kMaxCmaFrameBytes);
    if (!header.ok()) return close_locked(header.status().message());
    if (inbox_.size() - at - kFrameHeaderBytes < header->payload_bytes) break;
    ByteReader r(
        std::span<const std::byte>(inbox_).subspan(at + kFrameHeaderBytes, header->payload_bytes));
    at += kFrameHeaderBytes + header->payload_bytes;
    std::vector<CmaRange> ranges;
    const auto type = static_cast<CmaSessionFrame>(header->type);
    if (type == CmaSessionFrame::kAdd) {
      if (!get_cma_ranges(r, ranges)) return close_locked("a malformed Add frame");
      for (const CmaRange& range : ranges) declared_[range.addr] = range.length;
    } else if (type == CmaSessionFrame::kRevoke) {
      uint64_t sequence = 0;
      if (!r.get(sequence) || !get_cma_ranges(r, ranges)) {
        return close_locked("a malformed Revoke frame");
      }
      for (const CmaRange& range : ranges) {
        // Whatever overlaps the revoked range goes (an exact match in a well-formed stream).
        auto it = declared_.lower_bound(range.addr);
        if (it != declared_.begin() && std::prev(it)->first + std::prev(it)->second > range.addr) {
          --it;
        }
        while (it != declared_.end() && it->first < range.addr + range.length) {
          it = declared_.erase(it);
        }
      }
      ByteWriter ack;
      ack.put(sequence);
      if (!send_now(connection_.get(), make_cma_frame(CmaSessionFrame::kAck, ack.bytes()))) {
        return close_locked("an Ack could not be sent at once");
      }
    } else {
      return close_locked(fmt::format("unexpected frame type {}", header->type));
    }
  }
  if (closed_why_.empty()) {
    inbox_.erase(inbox_.begin(), inbox_.begin() + static_cast<std::ptrdiff_t>(at));
  }
}

}  // namespace kvferry
