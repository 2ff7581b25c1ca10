// TcpLaneService: what the lanes of one tcp transport share (tcp_lane.h): the I/O pool their
// sending and reading run on (core/io_pool.h), and the tending of lanes that wait for a time
// rather than for input: an answer left to its waiter past kWaiterReadGrace, a batch deadline
// to enforce while the lane waits for answers, a lane gone quiet whose connection is then
// watched for its peer closing it. An idle, watched lane costs no thread and no tending.
//
// Owned by the transport and by each of its lanes (shared_ptr): links outlive the transport
// in an engine's teardown.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "core/io_pool.h"
#include "core/net.h"

namespace kvferry::detail {

class TcpLane;

class TcpLaneService : public std::enable_shared_from_this<TcpLaneService> {
 public:
  static Result<std::shared_ptr<TcpLaneService>> create();

  IoPool& pool() { return *pool_; }
  // Lists `lane` for tending: its tend() runs by `when`, and again at each time it returns
  // until it returns time_point::max() (then the lane lists itself again when it needs to).
  void tend_by(const std::shared_ptr<TcpLane>& lane, Clock::time_point when);

 private:
  TcpLaneService() = default;
  // Tends the lanes that asked; returns when the next one wants it.
  Clock::time_point tick();

  std::unique_ptr<IoPool> pool_;
  std::mutex mu_;
  std::vector<std::weak_ptr<TcpLane>> tended_;  // guarded by mu_; a lane may be listed twice
};

}  // namespace kvferry::detail
