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
// Heartbeats are the same on both sides (prefill and decode), and one thread does them for
// all of an owner's channels: start() registers the channel with the owner's HeartbeatWheel,
// whose thread sends each channel a Heartbeat every heartbeat interval and checks every tick
// that some frame arrived within the heartbeat timeout. A silent peer (hung, or its host
// gone) closes the channel, and on_close gets PeerDisconnected "silent for more than N ms".
// A heartbeat never waits: it is skipped while another frame is being sent (that one is a
// sign of life too) or while the socket takes nothing (the peer reads nothing). Received
// Heartbeat messages are still handed to on_message (any frame counts as a sign of life;
// the owner ignores them). A thread per channel for this made two threads per decode-prefill
// link (docs/SCALING.md).
//
// Ownership: the channel owns its socket and its reader thread, which holds a reference to
// the channel until it has finished; the wheel holds none. Callbacks must not outlive what
// they capture: the owner calls close() before it goes away.
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

class HeartbeatWheel;

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
  // Starts the reader thread and registers the channel's heartbeats with `wheel`. Call once,
  // after the owner stored the channel.
  void start(const Heartbeats& heartbeats, HeartbeatWheel& wheel);
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
  friend class HeartbeatWheel;
  // One tick of the wheel: fails the channel when the peer has been silent too long, sends a
  // heartbeat when one is due. False once the channel is closed (the wheel forgets it).
  bool tick(Clock::time_point now, const Heartbeats& heartbeats, Clock::time_point& next_beat,
            uint64_t& sequence);
  // Sends a Heartbeat if that takes no waiting (see the file comment).
  void try_send_heartbeat(const Heartbeat& beat);
  // Shuts the socket down so the reader ends with `reason` (unless it already ended).
  void fail(Status reason);

  Fd fd_;
  std::string peer_name_;
  OnMessage on_message_;
  OnClose on_close_;
  std::mutex send_mu_;
  std::atomic<bool> closed_{false};
  std::mutex close_mu_;
  Status failure_;  // why fail() closed the channel; guarded by close_mu_
  std::atomic<int64_t> last_received_ns_{0};
  std::atomic<uint32_t> max_payload_bytes_{kMaxControlPayloadBytes};
  std::weak_ptr<ControlChannel> self_;  // the reader thread's own reference comes from here
  std::thread reader_;
};

// The thread that does the heartbeats of every channel started with it (kvf-pd-beat): it
// wakes at the earliest tick any of them is due, and never waits on a socket. Started with
// the first channel; the destructor stops and joins it (channels still open stop beating).
// Thread-safety: add() from any thread.
class HeartbeatWheel {
 public:
  HeartbeatWheel() = default;
  ~HeartbeatWheel();
  HeartbeatWheel(const HeartbeatWheel&) = delete;
  HeartbeatWheel& operator=(const HeartbeatWheel&) = delete;

  void add(const std::shared_ptr<ControlChannel>& channel,
           const ControlChannel::Heartbeats& heartbeats);
  // Channels beating now (closed ones are dropped at their next tick).
  size_t size() const;

 private:
  struct Entry {
    std::weak_ptr<ControlChannel> channel;
    ControlChannel::Heartbeats heartbeats;
    Clock::time_point next_tick;
    Clock::time_point next_beat;
    uint64_t sequence = 0;
  };
  void run();

  mutable std::mutex mu_;
  std::condition_variable cv_;  // an added channel or stop
  bool stopping_ = false;       // guarded by mu_
  bool changed_ = false;        // a channel was added since the thread last looked; mu_
  std::vector<Entry> entries_;  // guarded by mu_
  std::thread thread_;          // started by the first add()
};

}  // namespace kvferry::pd
