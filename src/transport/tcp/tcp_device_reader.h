// TcpDeviceReadStager: how the tcp receiver answers a kRead of its device memory. The
// request's range is cut into pieces of the staging buffer size; each piece is copied
// device -> pinned host by a TcpDeviceStager (its own thread and stream, pipelined, leasing
// buffers from the receiver's bounded pool and waiting, never failing, while it is
// exhausted). Once every piece of the request is staged, the result is queued for the I/O
// thread that asked, which is woken (`wake`) and sends the kReadData frame straight from the
// leased buffers (each lease returns when its bytes are handed to the socket).
//
// A request is answered only as a whole: a piece whose device copy fails fails the request,
// the later pieces are not copied, and the answer is an error status with no payload — no
// byte of a failed request is sent as valid. A request that needs more buffers than the pool
// holds is refused (InvalidArgument) instead of waiting forever. Staging stops between pieces
// when the request's deadline passes (Timeout) or its connection closes (`alive` marked).
//
// Thread-safety: stage() and take() from the owning I/O thread; `wake` runs on the stager's
// thread (or on the destroying thread, for requests never staged).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "transport/peer_liveness.h"
#include "transport/tcp/tcp_device_stager.h"
#include "transport/tcp/tcp_staging_pool.h"

namespace kvferry {

struct StagedRead {
  uint64_t conn = 0;  // the connection's serial, as given to stage()
  uint64_t request_id = 0;
  uint64_t length = 0;
  Status status;                     // OK: `pieces` hold the request's bytes, in order
  std::vector<StagingLease> pieces;  // each full but the last (length % buffer bytes)
};

class TcpDeviceReadStager {
 public:
  TcpDeviceReadStager(std::shared_ptr<CudaMemoryApi> api, std::shared_ptr<TcpStagingPool> pool,
                      std::function<void()> wake);
  ~TcpDeviceReadStager();
  TcpDeviceReadStager(const TcpDeviceReadStager&) = delete;
  TcpDeviceReadStager& operator=(const TcpDeviceReadStager&) = delete;

  // Stages [device_src, +length) of `device`. `keep` (the region's pin) is held until no
  // copy of the request can run any more. The result comes back through take().
  void stage(uint64_t conn, uint64_t request_id, const char* device_src, uint64_t length,
             int device, Clock::time_point deadline, std::shared_ptr<PeerLiveness> alive,
             std::shared_ptr<void> keep);
  // The requests finished since the last call.
  std::vector<StagedRead> take();
  uint64_t buffer_bytes() const { return pool_->buffer_bytes(); }

 private:
  void finished(StagedRead read);

  std::shared_ptr<TcpStagingPool> pool_;
  std::function<void()> wake_;
  std::mutex mu_;
  std::vector<StagedRead> done_;  // guarded by mu_
  // Declared last, destroyed first: it fails (through finished()) what it has not staged.
  std::unique_ptr<TcpDeviceStager> stager_;
};

}  // namespace kvferry
