// TcpDeviceReadStager: how the tcp receiver answers a kRead of its device memory. The
// request's range is cut into pieces of the staging buffer size; each piece is copied
// device -> pinned host by a TcpDeviceStager (its own thread and stream, pipelined, leasing
// buffers from the receiver's bounded pool and waiting, never failing, while it is
// exhausted). Once every piece of the request is staged, the result is put in the inbox of
// the I/O thread that asked, which is woken and sends the kReadData frame straight from the
// leased buffers (each lease returns when its bytes are handed to the socket).
//
// One stager serves all of a receiver's I/O threads, so requests are staged strictly one
// after the other: a request's pieces take their buffers consecutively, and every other
// leased buffer belongs to an answer that is fully staged and only waits to be sent — no two
// requests can each hold part of the pool while waiting for the rest.
//
// A request is answered only as a whole: a piece whose device copy fails fails the request,
// the later pieces are not copied, and the answer is an error status with no payload — no
// byte of a failed request is sent as valid. A request that needs more buffers than the pool
// holds is refused (InvalidArgument) instead of waiting forever. Staging stops between pieces
// when the request's deadline passes (Timeout) or its connection closes (`alive` marked).
//
// Thread-safety: every call is thread-safe. An inbox's wake runs on the stager's thread (or
// on the thread destroying the stager, for requests never staged), never after close().
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
  uint64_t conn = 0;  // the connection's tag, as given to stage()
  uint64_t request_id = 0;
  uint64_t length = 0;
  Status status;                     // OK: `pieces` hold the request's bytes, in order
  std::vector<StagingLease> pieces;  // each full but the last (length % buffer bytes)
};

// Where one I/O thread's finished requests wait for it.
class StagedReadInbox {
 public:
  explicit StagedReadInbox(std::function<void()> wake) : wake_(std::move(wake)) {}
  // Queues a result and wakes the owner; dropped (its leases returned) once closed.
  void put(StagedRead read);
  std::vector<StagedRead> take();
  // No result is queued, and no wake-up runs, after this returns.
  void close();

 private:
  std::mutex mu_;
  std::function<void()> wake_;    // guarded by mu_; null once closed
  std::vector<StagedRead> done_;  // guarded by mu_
};

class TcpDeviceReadStager {
 public:
  // A stager whose thread runs; Internal when it cannot start (core/named_thread.h).
  static Result<std::unique_ptr<TcpDeviceReadStager>> start(std::shared_ptr<CudaMemoryApi> api,
                                                            std::shared_ptr<TcpStagingPool> pool);
  ~TcpDeviceReadStager() = default;
  TcpDeviceReadStager(const TcpDeviceReadStager&) = delete;
  TcpDeviceReadStager& operator=(const TcpDeviceReadStager&) = delete;

  // Stages [device_src, +length) of `device`; the result goes to `inbox`. `keep` (the
  // region's pin) is held until no copy of the request can run any more.
  void stage(const std::shared_ptr<StagedReadInbox>& inbox, uint64_t conn, uint64_t request_id,
             const char* device_src, uint64_t length, int device, Clock::time_point deadline,
             std::shared_ptr<PeerLiveness> alive, std::shared_ptr<void> keep);
  uint64_t buffer_bytes() const { return pool_->buffer_bytes(); }

 private:
  TcpDeviceReadStager(std::shared_ptr<CudaMemoryApi> api, std::shared_ptr<TcpStagingPool> pool);
  std::shared_ptr<TcpStagingPool> pool_;
  TcpDeviceStager stager_;  // fails, on destruction, what it has not staged
};

// The receiver's read stager, shared by its I/O threads and created on first need.
class TcpDeviceReadService {
 public:
  explicit TcpDeviceReadService(std::shared_ptr<TcpDeviceStaging> staging)
      : staging_(std::move(staging)) {}
  // NotSupported where this build cannot stage; the runtime's error when it cannot open.
  Result<TcpDeviceReadStager*> stager();

 private:
  std::shared_ptr<TcpDeviceStaging> staging_;
  std::mutex mu_;
  std::unique_ptr<TcpDeviceReadStager> stager_;  // guarded by mu_ until created
};

}  // namespace kvferry
