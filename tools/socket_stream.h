// SocketStream: the benchmarks' plain-TCP reference, one blocking stream to a serve child's
// sink (serve_client.h), moving what kvferry's tcp moves in a batch: a request word and the
// blocks, answered with one byte (WRITE), or the blocks received straight into place (READ).
// Used by `bench engine` (the tcp reference of every cell) and `bench scale` (the peers
// axis: the same write to N children, round-robin).
//
// Thread-safety: one stream per thread.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/net.h"
#include "kvferry/status.h"
#include "serve_client.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry::cli {

// (destination, source) pairs of one batch; a WRITE sends only the sources.
using CopyList = std::vector<std::pair<char*, const char*>>;

// The tcp reference: one plain blocking TCP stream to the serve child's sink. A batch is one
// request word and its blocks as one iovec list (sendmsg as few times as IOV_MAX allows),
// answered with one byte; a READ batch is one request word answered with the bytes, received
// straight into the blocks with recvmsg. A polling stream (`hot`) has both ends poll for the
// next message for kTcpHotTime before they sleep, as kvferry's tcp does after a lone small
// request: on a VM where waking a halted vCPU costs tens of microseconds, that is the
// stronger round trip unless both processes happen to share one vCPU.
class SocketStream {
 public:
  static Result<SocketStream> connect(const std::string& host, uint16_t port, bool hot) {
    KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp({host, port}, Clock::now() + std::chrono::seconds(5)));
    const int flags = ::fcntl(fd.get(), F_GETFL);
    if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "fcntl on the reference socket", errno);
    }
    SocketStream stream(std::move(fd), hot);
    if (hot) {
      uint64_t word = kSinkPollWord;
      stream.iov_.push_back({&word, sizeof(word)});
      KVF_RETURN_IF_ERROR(stream.transfer(true));
    }
    return stream;
  }

  // copies: (destination offset holder, source) pairs; only the sources are sent.
  Status write_batch(const CopyList& copies, uint64_t block) {
    uint64_t word = block * copies.size();
    iov_.clear();
    iov_.push_back({&word, sizeof(word)});
    for (const auto& copy : copies) iov_.push_back({const_cast<char*>(copy.second), block});
    KVF_RETURN_IF_ERROR(transfer(true));
    char ack = 0;
    iov_.clear();
    iov_.push_back({&ack, 1});
    return transfer(false);
  }

  // Receives the batch's bytes into the copies' destinations.
  Status read_batch(const CopyList& copies, uint64_t block) {
    uint64_t word = (block * copies.size()) | kSinkReadFlag;
    iov_.clear();
    iov_.push_back({&word, sizeof(word)});
    KVF_RETURN_IF_ERROR(transfer(true));
    iov_.clear();
    for (const auto& copy : copies) iov_.push_back({copy.first, block});
    return transfer(false);
  }

 private:
  SocketStream(Fd fd, bool hot) : fd_(std::move(fd)), hot_(hot) {}

  // Sends or receives all of iov_; a hot receive polls (MSG_DONTWAIT) for kTcpHotTime first.
  Status transfer(bool send) {
    const Clock::time_point hot_until = hot_ ? Clock::now() + kTcpHotTime : Clock::time_point{};
    size_t first = 0;
    while (first < iov_.size()) {
      msghdr msg{};
      msg.msg_iov = iov_.data() + first;
      msg.msg_iovlen = std::min<size_t>(iov_.size() - first, IOV_MAX);
      const bool polling = !send && hot_ && Clock::now() < hot_until;
      ssize_t n = send ? ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL)
                       : ::recvmsg(fd_.get(), &msg, polling ? MSG_DONTWAIT : MSG_WAITALL);
      if (n < 0 && (errno == EINTR || (polling && errno == EAGAIN))) continue;
      if (n <= 0) return PeerDisconnected("reference stream broke");
      auto done = static_cast<size_t>(n);
      while (first < iov_.size() && done >= iov_[first].iov_len) done -= iov_[first++].iov_len;
      if (first < iov_.size()) {
        iov_[first].iov_base = static_cast<char*>(iov_[first].iov_base) + done;
        iov_[first].iov_len -= done;
      }
    }
    return Status::Ok();
  }

  Fd fd_;
  bool hot_;
  std::vector<iovec> iov_;
};

}  // namespace kvferry::cli
