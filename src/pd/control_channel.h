// ControlChannel: one TCP connection between a decode rank and a prefill rank carrying
// control message frames both ways.
//
// Framed TCP on core/net.h rather than ZeroMQ: the session layer must notice a dead peer at
// once (a killed process closes its sockets, and EOF here fails its requests), while ZeroMQ
// hides disconnects behind silent reconnects and queues. One persistent connection per rank
// pair also gives message order per request for free.
//
// open() wraps the socket; start() hands it to the owner's ControlHub, whose reader pool
// (an IoPool) watches it: when bytes arrive a pool worker takes a reading turn, reads what
// is there, decodes each whole frame and hands its message to on_message, then watches the
// socket again. A frame may arrive over many turns. Turns of one channel never overlap, so
// its messages arrive in order, one at a time. A malformed frame is logged and closes the
// channel (ProtocolError). on_close runs exactly once, on the last reading turn, with the
// reason (EOF, reset, bad frame, silence, or close()). The two steps let the owner publish
// the channel (store the pointer its callbacks use) before the first callback can run.
//
// Each frame's payload is capped (limit_payload_bytes): a header that claims more than the cap
// fails the channel (ProtocolError) before a byte of the payload is read or stored, and the
// buffer of a frame that is within it grows with the bytes that arrive, never past the claim.
// A frame's buffer is freed once its message is handed over.
//
// Heartbeats are the same on both sides (prefill and decode), and one thread does them for
// all of an owner's channels: start() registers the channel with the owner's ControlHub,
// whose thread sends each channel a Heartbeat every heartbeat interval and checks every tick
// that some frame arrived within the heartbeat timeout. A silent peer (hung, or its host
// gone) closes the channel, and on_close gets PeerDisconnected "silent for more than N ms".
// A heartbeat never waits: it is skipped while another frame is being sent (that one is a
// sign of life too) or while the socket takes nothing (the peer reads nothing). Received
// Heartbeat messages are still handed to on_message (any frame counts as a sign of life;
// the owner ignores them).
//
// Threads: an owner's channels share the hub's heartbeat thread and its reader pool, whose
// workers are as many as the callbacks running at once, plus one waiting. A reader and a
// heartbeat thread per channel would be thousands per process at scale (docs/SCALING.md).
//
// Ownership: from start() until on_close has run, the pool's watch holds a reference to the
// channel, as a reader thread of its own would; the hub's heartbeats hold none. Callbacks must
// not outlive what they capture: the owner calls close() before it goes away, and the hub
// outlives its channels' close().
// Thread-safety: send() and close() are safe from any thread (close() from a callback of the
// channel does not wait for itself).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/frame_header.h"
#include "core/io_pool.h"
#include "core/mapped_memory.h"
#include "core/net.h"
#include "kvferry/defaults.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/pd/pd_options.h"

namespace kvferry::pd {

class ControlHub;

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
  // Starts reading on `hub`'s reader pool and registers the channel's heartbeats with it.
  // Call once, after the owner stored the channel. When the pool cannot take the socket (no
  // descriptor for it) or the hub's thread cannot start, on_close runs on this thread with
  // the reason.
  void start(const Heartbeats& heartbeats, ControlHub& hub);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // Sends one message within `timeout`. PeerDisconnected once closed.
  Status send(const ControlMessage& message,
              std::chrono::milliseconds timeout = kDefaultHandshakeTimeout);
  // Shuts the socket down and, once started, waits until on_close has run (unless called from
  // one of this channel's callbacks).
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
  // A reading turn (a pool worker): reads what has arrived, hands over each whole message,
  // then watches the socket again, or ends the channel.
  void on_readable();
  // Reads and hands over what has arrived: OK once nothing more is there, else why the
  // stream ended.
  Status read_available();
  // The end: logs a rejected frame, runs on_close once, releases the watch (and with it the
  // pool's reference), and lets close() return.
  void finish(Status reason);
  friend class ControlHub;
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
  std::weak_ptr<ControlChannel> self_;  // the watch's own reference comes from here

  // Held for a whole reading turn: turns of this channel run one at a time on any worker, and
  // this orders each after the one before for everything they touch (the frame below, the
  // owner's state its callbacks change) in a way the thread sanitizer sees too.
  std::mutex turn_mu_;
  // The frame being read, across reading turns.
  std::array<std::byte, kFrameHeaderBytes> header_bytes_{};
  size_t header_have_ = 0;
  std::optional<FrameHeader> header_;  // set once the header is whole and within the cap
  // Large frames in mappings of their own, unmapped when freed: the bytes a flood of held
  // frames made this process keep go back to the system (core/mapped_memory.h).
  std::vector<std::byte, ReturnedAllocator<std::byte>> payload_;

  std::mutex watch_mu_;
  std::unique_ptr<IoPool::Watch> watch_;  // guarded by watch_mu_; destroyed before fd_
  std::mutex end_mu_;
  std::condition_variable ended_cv_;
  bool started_ = false;  // guarded by end_mu_
  bool ended_ = false;    // on_close has run; guarded by end_mu_
};

// What an owner's channels share: the thread that does the heartbeats of every channel
// started with it (kvf-pd-beat), which wakes at the earliest tick any of them is due and never
// waits on a socket, and the pool their reading turns run on (kvf-pd-ctl-i). Both start with
// the first channel; the destructor stops them (channels still open stop beating).
// Thread-safety: every method from any thread.
class ControlHub {
 public:
  ControlHub() = default;
  ~ControlHub();
  ControlHub(const ControlHub&) = delete;
  ControlHub& operator=(const ControlHub&) = delete;

  // Beats and checks `channel` from now on; Internal when the hub's thread is not running
  // and cannot start.
  Status add(const std::shared_ptr<ControlChannel>& channel,
             const ControlChannel::Heartbeats& heartbeats);
  // Channels beating now (closed ones are dropped at their next tick).
  size_t size() const;
  // The reader pool, started by the first call; an error when it cannot be (no descriptors).
  Result<IoPool*> readers();

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
  // Last: its workers (callbacks of channels) end before the rest goes.
  std::unique_ptr<IoPool> readers_;  // guarded by mu_
};

}  // namespace kvferry::pd
