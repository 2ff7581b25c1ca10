// UcxChannel: the ucx transport's state for one peer incarnation, living on the progress
// thread (ucx_worker.h): the endpoint to the peer's worker (created on first need, again
// after a failure or a deadline), the rkeys unpacked on it, and the queue of batch parts
// (UcxJob) to run, one at a time in order.
//
// A job posts its ops as put (WRITE) or get (READ), in chunks of at most kUcxChunkBytes,
// with at most kUcxWindowRequests requests outstanding, tracking every request's status;
// once all are posted and answered it flushes the endpoint. It ends OK only when every
// request succeeded and the flush completed (a flush can report OK while the requests it
// covers failed).
//
// Deadlines and failures: before each chunk, and on every pump, the job asks its batch's
// stop_reason(); when the batch must stop (Timeout, Cancelled, the peer gone) with requests
// outstanding, the endpoint is force-closed (UCP_EP_CLOSE_FLAG_FORCE), which completes them
// as cancelled, and the job ends with the stop reason. The next job reconnects. UCX's error
// callback (UCP_ERR_HANDLING_MODE_PEER) marks the peer disconnected; its requests then fail
// with PeerDisconnected.
//
// What a force close cannot take back: on hardware RMA a put the NIC already sent lands;
// on UCX's emulated paths (tcp) a put already in the stopped peer's socket buffer lands
// when the peer resumes, and a resumed peer's replies to cancelled gets are still copied
// into the local buffer by this worker (no registration is consulted for either, so
// revoking memh or rkey does not stop them; docs/TRANSPORTS.md, "ucx", late bytes).
//
// Thread-safety: everything but the constructor runs on the progress thread.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "transport/batch_progress.h"
#include "transport/peer_liveness.h"
#include "transport/resolved_op.h"
#include "transport/ucx/ucx_worker.h"

namespace kvferry::detail {

inline constexpr uint64_t kUcxChunkBytes = 8ull << 20;
inline constexpr int kUcxWindowRequests = 64;

struct UcxOp {
  OpKind kind = OpKind::kWrite;
  char* local = nullptr;
  uint64_t remote_addr = 0;
  uint64_t length = 0;
  uint64_t region_addr = 0;           // the peer's region holding the remote range
  const std::string* rkey = nullptr;  // its packed rkey (kept alive by the batch)
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
};

class UcxChannel final : public UcxPumped, public std::enable_shared_from_this<UcxChannel> {
 public:
  UcxChannel(UcxWorker& worker, std::string peer_name, std::string peer_address,
             std::shared_ptr<PeerLiveness> liveness);
  ~UcxChannel() override;

  // Progress thread: queues a job.
  void enqueue(std::unique_ptr<UcxJob> job);
  // Progress thread: fails what it carries with `why` and closes the endpoint.
  void shut(const Status& why);

  Outcome pump(Clock::time_point now, Clock::time_point& wake_at) override;
  void abandon() override;

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
  void start_flush(UcxJob& job);
  void close_endpoint();
  bool reap_closing();
  Status request_failure(ucs_status_t status, std::string_view what) const;

  static void on_request_done(void* request, ucs_status_t status, void* user_data);
  static void on_flush_done(void* request, ucs_status_t status, void* user_data);
  static void on_endpoint_error(void* arg, ucp_ep_h ep, ucs_status_t status);

  UcxWorker& worker_;
  const std::string peer_name_;
  const std::string peer_address_;
  const std::shared_ptr<PeerLiveness> liveness_;
  ucp_ep_h ep_ = nullptr;
  bool ep_broken_ = false;
  ucs_status_t ep_error_ = UCS_OK;
  std::map<uint64_t, RemoteKey> rkeys_;  // by the peer's region address, for ep_
  std::deque<std::unique_ptr<UcxJob>> jobs_;
  std::vector<Closing> closing_;
};

}  // namespace kvferry::detail
