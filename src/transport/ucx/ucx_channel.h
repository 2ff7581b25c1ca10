// UcxChannel: the ucx transport's state for one peer incarnation, living on the progress
// thread (ucx_worker.h): the endpoint to the peer's worker (created on first need, again
// after a failure or a deadline), the rkeys unpacked on it, and the queue of batch parts
// (UcxJob) to run, one at a time in order.
//
// A job moves its ops in chunks of at most kUcxChunkBytes, along the data path chosen for
// the peer (choose_ucx_data_path, ucx_am_wire.h):
//  * kRma (hardware RMA on both sides): put (WRITE) or get (READ), at most
//    kUcxWindowRequests requests outstanding, every request's status tracked; once all are
//    posted and answered it flushes the endpoint. It ends OK only when every request
//    succeeded and the flush completed (a flush can report OK while the requests it covers
//    failed).
//  * kActiveMessages (emulated: tcp, shared memory): kvferry's own requests, checked by the
//    target's handler against its registered regions and the deadline on its clock (the
//    offset is measured once per channel with a kPing before the first chunk). A WRITE
//    chunk ends with the target's ack and its send's completion; a READ chunk with its
//    reply, whose bytes are copied into the op's memory only while the batch may proceed
//    (a CopyGuard taken, then stop_reason() asked), so nothing of a batch lands after it
//    stopped. At most kUcxWindowRequests chunks or kUcxAmWindowBytes await replies.
//
// Deadlines and failures: before each chunk, and on every pump, the job asks its batch's
// stop_reason(); when the batch must stop (Timeout, Cancelled, the peer gone) with requests
// outstanding, the endpoint is force-closed (UCP_EP_CLOSE_FLAG_FORCE), which completes them
// as cancelled, and the job ends with the stop reason; replies still due are forgotten (the
// worker drops them). The next job reconnects. UCX's error callback
// (UCP_ERR_HANDLING_MODE_PEER) marks the peer disconnected; its requests then fail with
// PeerDisconnected.
//
// What a force close cannot take back on kRma: a put the NIC already sent lands (within
// fabric transit). On kActiveMessages a WRITE chunk's bytes land only if the target finds
// it within the deadline once all of it is in (a rendezvous chunk is received into a buffer
// of the target's first, and dropped if it took longer than the target's frame-rest timeout;
// docs/TRANSPORTS.md, "ucx").
//
// Thread-safety: everything but the constructor runs in a turn of the worker (ucx_worker.h).
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "transport/batch_progress.h"
#include "transport/peer_liveness.h"
#include "transport/resolved_op.h"
#include "transport/ucx/ucx_am_wire.h"
#include "transport/ucx/ucx_worker.h"

namespace kvferry::detail {

inline constexpr uint64_t kUcxChunkBytes = 8ull << 20;
static_assert(kUcxChunkBytes <= kUcxMaxAmWriteBytes, "a target refuses larger writes");
inline constexpr int kUcxWindowRequests = 64;
// Active messages: the most bytes of one job awaiting replies (READ replies are buffered by
// UCX until their handler copies them).
inline constexpr uint64_t kUcxAmWindowBytes = 64ull << 20;

struct UcxOp {
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
  uint64_t region_addr = 0;           // the peer's region holding the remote range
  const std::string* rkey = nullptr;  // its packed rkey (kept alive by the batch)
};

struct UcxJob;

// One active-message chunk of a job, from posting until its reply and send are done.
struct UcxAmChunk {
  UcxJob* job = nullptr;
  uint64_t request_id = 0;
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;
  uint64_t length = 0;
  UcxAmHeaderBytes header{};  // UCX may read it until the send completes
  bool replied = false;
  bool sent = false;
};

struct UcxJob {
  std::shared_ptr<BatchProgress> batch;
  std::vector<UcxOp> ops;
  size_t next_op = 0;
  uint64_t next_offset = 0;  // into ops[next_op]
  int outstanding = 0;       // requests posted and not completed
  bool started = false;
  bool flushing = false;
  bool flushed = false;
  Status error;                         // the first failure
  ucs_status_t request_error = UCS_OK;  // the first failed request's status (callbacks)
  BatchProgress::WireGuard wire;
  // Active messages: chunks posted (stable addresses), and how many await their reply.
  std::deque<UcxAmChunk> chunks;
  int awaiting = 0;
  uint64_t awaiting_bytes = 0;
};

class UcxChannel final : public UcxPumped,
                         public UcxAmClient,
                         public std::enable_shared_from_this<UcxChannel> {
 public:
  UcxChannel(UcxWorker& worker, std::string peer_name, std::string peer_address,
             std::shared_ptr<PeerLiveness> liveness, UcxDataPath path);
  ~UcxChannel() override;

  // Progress thread: queues a job.
  void enqueue(std::unique_ptr<UcxJob> job);
  // Progress thread: fails what it carries with `why` and closes the endpoint.
  void shut(const Status& why);

  Outcome pump(Clock::time_point now, Clock::time_point& wake_at) override;
  void abandon() override;
  void on_am_reply(UcxAmId id, const UcxAmHeader& h, const void* data, size_t length) override;

 private:
  struct RemoteKey {
    std::string packed;
    ucp_rkey_h rkey = nullptr;
  };
  struct Closing {
    void* request = nullptr;
    std::vector<ucp_rkey_h> rkeys;
  };

  Status ensure_endpoint();
  Result<ucp_rkey_h> rkey_for(const UcxOp& op);
  // Posts chunks while the window allows; returns whether it posted anything.
  bool post_chunks(UcxJob& job);
  bool post_am_chunks(UcxJob& job);
  // Starts the clock-offset ping once an endpoint exists; true once the offset is known.
  bool clock_synced();
  // The job's chunks no longer expect replies (the worker drops late ones).
  void forget_replies(UcxJob& job);
  void start_flush(UcxJob& job);
  void close_endpoint();
  bool reap_closing();
  Status request_failure(ucs_status_t status, std::string_view what) const;

  static void on_request_done(void* request, ucs_status_t status, void* user_data);
  static void on_am_chunk_sent(void* request, ucs_status_t status, void* user_data);
  static void on_ping_sent(void* request, ucs_status_t status, void* user_data);
  static void on_flush_done(void* request, ucs_status_t status, void* user_data);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker& worker_;
  const std::string peer_name_;
  const std::string peer_address_;
  const std::shared_ptr<PeerLiveness> liveness_;
  const UcxDataPath path_;
  ucp_ep_h ep_ = nullptr;
  bool ep_broken_ = false;
  ucs_status_t ep_error_ = UCS_OK;
  std::map<uint64_t, RemoteKey> rkeys_;  // by the peer's region address, for ep_
  std::deque<std::unique_ptr<UcxJob>> jobs_;
  std::vector<Closing> closing_;
  // Active messages: the chunks awaiting a reply, by request id; the clock offset to the
  // peer (its clock minus ours, measured so converted deadlines err early).
  std::unordered_map<uint64_t, UcxAmChunk*> awaiting_;
  uint64_t ping_id_ = 0;  // the kPing awaiting its kPong, or 0
  UcxAmHeaderBytes ping_header_{};
  bool ping_sending_ = false;  // UCX still holds ping_header_
  bool clock_synced_ = false;
  int64_t clock_offset_ns_ = 0;
};

}  // namespace kvferry::detail
