// ControlChannel: one TCP connection between a decode rank and a prefill rank carrying
// control message frames both ways.
//
// Framed TCP on core/net.h rather than ZeroMQ: the session layer must notice a dead peer at
// once (a killed process closes its sockets, and EOF here fails its requests), while ZeroMQ
// hides disconnects behind silent reconnects and queues. One persistent connection per rank
// pair also gives message order per request for free.
//
// open() wraps the socket; start() starts the reader thread, which decodes frames and hands
// each message to on_message; a malformed frame is logged and closes the channel
// (ProtocolError). on_close runs exactly once, on the reader thread, with the reason (EOF,
// reset, bad frame, silence, or close()). The two steps let the owner publish the channel
// (store the pointer its callbacks use) before the first callback can run.
//
// Each frame's payload is capped (limit_payload_bytes): a header that claims more than the cap
// fails the channel (ProtocolError) before a byte of the payload is read or stored, and the
// buffer of a frame that is within it grows with the bytes that arrive, never past the claim.
// A frame's buffer is freed once its message is handed over.
//
// Heartbeats are the channel's own, the same on both sides (prefill and decode): start()
// also starts a heartbeat thread that sends a Heartbeat every heartbeat interval and checks
// every tick that some frame arrived within the heartbeat timeout. A silent peer (hung, or
// its host gone) closes the channel, and on_close gets PeerDisconnected "silent for more
// than N ms". Received Heartbeat messages are still handed to on_message (any frame counts
// as a sign of life; the owner ignores them).
//
// Ownership: the channel owns its socket and both threads; each thread holds a reference to
// the channel until it has finished. Callbacks must not outlive what they capture: the owner
// calls close() before it goes away.
// Thread-safety: send() and close() are safe from any thread (close() from the reader thread
// does not join itself).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/defaults.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/pd_options.h"

namespace kvferry::pd {

class ControlChannel {
 public:
  using OnMessage = std::function<void(ControlMessage&&)>;
  using OnClose = std::function<void(const Status&)>;

  // Takes the connected socket; nothing is read until start().
  static std::shared_ptr<ControlChannel> open(Fd fd, std::string peer_name, OnMessage on_message,
                                              OnClose on_close);
  struct Heartbeats {
    PdTimeouts timeouts;       // interval, timeout and tick (pd_options.h)
    uint64_t incarnation = 0;  // this side's engine incarnation, carried in each Heartbeat
  };
  // Starts the reader and heartbeat threads. Call once, after the owner stored the channel.
  void start(const Heartbeats& heartbeats);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Sends one message within `timeout`. PeerDisconnected once closed.
  Status send(const ControlMessage& message,
              std::chrono::milliseconds timeout = kDefaultHandshakeTimeout);
  // Shuts the socket down and (unless called on the reader thread) joins the reader.
  void close();

  // The largest payload the next frames may carry (kMaxControlPayloadBytes until called). The
  // owner caps a peer that has not earned more before start() (pd/control_auth.h) and raises
  // the cap from on_message once it has; a frame whose header the reader has not yet read gets
  // the new cap.
  void limit_payload_bytes(uint32_t max_payload_bytes) { max_payload_bytes_ = max_payload_bytes; }

  const std::string& peer_name() const { return peer_name_; }
  bool closed() const { return closed_.load(); }
  // When the last frame arrived (the channel's start time before any).
  Clock::time_point last_received() const {
    return Clock::time_point(Clock::duration(last_received_ns_.load()));
  }

 private:
  ControlChannel(Fd fd, std::string peer_name)
      : fd_(std::move(fd)), peer_name_(std::move(peer_name)) {}
  void read_loop();
  Status read_one(ControlMessage& out);
  void heartbeat_loop(const Heartbeats& heartbeats);
  // Shuts the socket down so the reader ends with `reason` (unless it already ended).
  void fail(Status reason);

  Fd fd_;
  std::string peer_name_;
  OnMessage on_message_;
  OnClose on_close_;
  std::mutex send_mu_;
  std::atomic<bool> closed_{false};
  std::mutex close_mu_;
  std::condition_variable close_cv_;  // wakes the heartbeat thread once closed_
  Status failure_;                    // why fail() closed the channel; guarded by close_mu_
  std::atomic<int64_t> last_received_ns_{0};
  std::atomic<uint32_t> max_payload_bytes_{kMaxControlPayloadBytes};
  std::weak_ptr<ControlChannel> self_;  // the reader thread's own reference comes from here
  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace kvferry::pd
