// NotifyConnection: one sender's connection as the NotificationReceiver's loop holds it: where
// it is in the protocol (notify_wire.h), the one frame being received, the replies not yet
// sent, and what it has proved and delivered. Its I/O never blocks: receive_some reads at
// most the rest of the frame being received, so the buffer holds one frame at a time and
// grows with the bytes that arrived; send_some sends what the socket takes.
//
// Thread-safety: the loop thread's own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/acceptor.h"
#include "core/auth.h"
#include "core/fd.h"
#include "core/frame_header.h"
#include "core/net.h"
#include "engine/notify_wire.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::detail {

inline constexpr Clock::time_point kNotifyNever = Clock::time_point::max();
// Replies (acks) a sender may leave untaken before its connection is not read either.
inline constexpr size_t kMaxUntakenNotifyReplyBytes = 4096;

enum class NotifyPhase {
  kHello,    // waiting for the hello
  kProof,    // the challenge carried a nonce: waiting for the proof
  kServing,  // welcomed: notifications in, acks out
  kClosing,  // refused: the kError frame goes out, then input is discarded until the close
};

// The largest payload a frame of `type` may carry in `phase`; nullopt: not expected there.
std::optional<uint32_t> notify_frame_bound(NotifyPhase phase, NotifyFrame type,
                                           uint32_t max_notification_bytes);
// What `phase` expects, for messages: "a hello".
std::string_view notify_phase_expects(NotifyPhase phase);

struct NotifyConnection {
  Fd fd;
  ConnectionSlot slot;
  NotifyPhase phase = NotifyPhase::kHello;
  Clock::time_point deadline = kNotifyNever;      // the setup, or the frame being received
  Clock::time_point out_deadline = kNotifyNever;  // replies not yet taken by the sender
  std::vector<std::byte> in;                      // the frame being received, nothing beyond
  std::optional<FrameHeader> header;              // its header, once whole and checked
  std::vector<std::byte> out;                     // replies not yet sent
  size_t out_sent = 0;
  bool write_shut = false;     // kClosing: the refusal is out and our side is shut
  bool closed = false;         // to be removed by the loop
  uint32_t events = 0;         // what epoll watches on it
  size_t accounted_bytes = 0;  // its buffers, as counted in the receiver's stats
  NotifyHello hello;
  std::optional<AuthNonce> nonce;
  bool proven = false;
  bool delivered = false;
  size_t lost_reserved_bytes = 0;       // the room reserved for its kSenderLost entry; 0: none
  std::optional<Notification> waiting;  // read, not yet in the inbox nor acknowledged
  uint64_t waiting_sequence = 0;
  bool counted_held_back = false;  // `waiting` was counted as held back

  size_t untaken() const { return out.size() - out_sent; }
  size_t buffer_bytes() const {
    return in.capacity() + out.capacity() + (waiting ? waiting->bytes.capacity() : 0);
  }
  bool frame_complete() const {
    return header && in.size() == kFrameHeaderBytes + header->payload_bytes;
  }

  // Receives some of the rest of the frame being received: the bytes it got, 0 when the
  // sender closed, or -1 with errno set (EAGAIN: nothing there now).
  ssize_t receive_some();
  // The frame was handled: the buffer is emptied (and given back if one frame made it large).
  void consume_frame();
  // Appends a frame to the replies; send_some sends it.
  void queue(NotifyFrame type, std::span<const std::byte> payload);
  // Sends what the socket takes; replies that stall past `stall_timeout` set out_deadline.
  // Once a kClosing connection's refusal is out, shuts our side. False when sending failed
  // (errno set).
  bool send_some(std::chrono::milliseconds stall_timeout);
  // kClosing: reads and discards; false once the sender closed or the connection broke.
  bool discard_input();
};

}  // namespace kvferry::detail
