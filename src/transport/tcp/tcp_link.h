// TcpLink: the initiating side of the tcp transport for one peer — a few persistent
// connections ("lanes", opened on first use and reused) over which a batch's ops are
// striped in chunks of at most kTcpChunkBytes, so lanes share large ops; consecutive small
// host-memory ops (≤ 64 KiB) go many to a vector frame (kWriteV / kReadV, one ack each).
//
// A lane has no thread of its own (tcp_lane.h): its request frames (and WRITE payloads,
// straight from registered memory) are sent and its answers (acknowledgements, READ payloads
// received straight into registered memory) read in turns on the transport's I/O pool
// (TcpLaneService). A chunk completes when its acknowledgement (or its data) arrives:
// completion means the bytes are in place.
// A part of at most 512 KiB goes whole on one lane, sent on the posting thread when the lane
// is idle, and the thread that then waits for the batch reads its answers itself (the lane's
// reading role), so a small batch crosses two threads, as a plain request/answer stream does.
//
// A WRITE from this engine's device memory is staged through pinned host buffers first
// (TcpDeviceStager, one per link, created on first need) and sent from there. A READ into
// this engine's device memory is received into the lane reader's pinned buffer and copied to
// the device (TcpDeviceLander) before its chunk completes; a READ of the peer's device memory
// is staged by the peer's receiver. Ops touching device memory are cut at the staging buffer
// size.
//
// Failure: a lane whose connection breaks fails every chunk queued or in flight on it
// with PeerDisconnected and is replaced on the next post (checking the peer's
// incarnation). A lane with a chunk unanswered past its deadline is closed: nothing more
// can come of it (the receiver never writes a request's bytes after its deadline).
//
// Thread-safety: post() may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/net.h"
#include "kvferry/defaults.h"
#include "transport/tcp/tcp_device_stager.h"
#include "transport/tcp/tcp_staging_pool.h"
#include "transport/transport.h"

namespace kvferry::detail {

inline constexpr uint64_t kTcpChunkBytes = 4ull << 20;
inline constexpr uint64_t kTcpMinChunkBytes = 256ull << 10;

class TcpLaneService;

struct TcpLinkOptions {
  Endpoint endpoint;  // the peer's tcp data endpoint
  std::string peer_name;
  uint64_t expected_incarnation = 0;
  int lanes = 4;  // EngineOptions::tcp_lanes
  std::chrono::milliseconds connect_timeout = kDefaultHandshakeTimeout;
  std::optional<std::string> secret;
  // How long the rest of an answer frame may take once it began (EngineOptions).
  std::chrono::milliseconds frame_rest_timeout = kDefaultFrameRestTimeout;
  // Device memory staging, shared by the engine's tcp links and receiver (null: none).
  std::shared_ptr<TcpDeviceStaging> device;
  // The transport's I/O pool and lane tending (tcp_lane_service.h).
  std::shared_ptr<TcpLaneService> service;
};

class TcpLane;

class TcpLink final : public TransportLink {
 public:
  explicit TcpLink(TcpLinkOptions options);
  ~TcpLink() override;
  TcpLink(const TcpLink&) = delete;
  TcpLink& operator=(const TcpLink&) = delete;

  // Splits the part's ops into chunks and queues them on the lanes, one task per chunk.
  // Errors (no lane could connect, the peer restarted) are returned before anything is
  // queued.
  Status post(const BatchPart& part) override;
  // Closes every lane: what they carry fails with PeerDisconnected. A later post()
  // reconnects.
  void shutdown() override;

 private:
  // Lane `index`, connected first if it is not (or broke). Never blocks past
  // `batch_deadline`: a connection still in progress then is the batch's Timeout.
  Result<std::shared_ptr<TcpLane>> lane(size_t index, Clock::time_point batch_deadline);
  // For a part that goes on one lane: the first lane that carries nothing (or is not
  // connected yet), else the next in turn. Back-to-back batches then keep to one lane, so one
  // lane and one peer receiver stay busy rather than four each waking; concurrent ones still
  // spread. (Turn by turn, each of four lanes was tended every kWaiterReadGrace while it had
  // been busy within kReaderIdleSleep.)
  size_t quiet_lane();
  Result<TcpDeviceStager*> stager();

  TcpLinkOptions options_;
  std::mutex mu_;
  std::condition_variable lanes_cv_;             // a lane's connection attempt ended
  std::vector<std::shared_ptr<TcpLane>> lanes_;  // guarded by mu_
  std::vector<bool> connecting_;                 // per lane, guarded by mu_
  std::atomic<uint64_t> next_lane_{0};
  std::mutex stager_mu_;
  // Declared last, destroyed first: it fails the chunks it has not staged.
  std::unique_ptr<TcpDeviceStager> stager_;  // guarded by stager_mu_ until created
};

}  // namespace kvferry::detail
