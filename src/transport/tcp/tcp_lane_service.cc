#include "transport/tcp/tcp_lane_service.h"

#include <unordered_set>

#include "transport/tcp/tcp_lane.h"

namespace kvferry::detail {

Result<std::shared_ptr<TcpLaneService>> TcpLaneService::create() {
  std::shared_ptr<TcpLaneService> s(new TcpLaneService());
  IoPool::Options o;
  o.name = "kvf-tcp-io";
  // One waits while the engine is idle; a second, started by the first event that finds it
  // alone, stays while events keep coming (it ends after 10 s without one).
  o.keep = 1;
  o.idle_exit = std::chrono::seconds(10);
  KVF_ASSIGN_OR_RETURN(s->pool_, IoPool::create(o));
  s->pool_->set_timer([weak = std::weak_ptr<TcpLaneService>(s)] {
    std::shared_ptr<TcpLaneService> self = weak.lock();
    return self ? self->tick() : Clock::time_point::max();
  });
  return s;
}

void TcpLaneService::tend_by(const std::shared_ptr<TcpLane>& lane, Clock::time_point when) {
  {
    std::lock_guard lock(mu_);
    tended_.push_back(lane);
  }
  pool_->wake_timer_by(when);
}

Clock::time_point TcpLaneService::tick() {
  std::vector<std::weak_ptr<TcpLane>> due;
  {
    std::lock_guard lock(mu_);
    due.swap(tended_);
  }
  const Clock::time_point now = Clock::now();
  Clock::time_point next = Clock::time_point::max();
  std::vector<std::weak_ptr<TcpLane>> again;
  std::unordered_set<const TcpLane*> seen;
  for (const std::weak_ptr<TcpLane>& weak : due) {
    std::shared_ptr<TcpLane> lane = weak.lock();
    if (!lane || !seen.insert(lane.get()).second) continue;
    const Clock::time_point wanted = lane->tend(now);
    if (wanted == Clock::time_point::max()) continue;
    next = std::min(next, wanted);
    again.push_back(weak);
  }
  std::lock_guard lock(mu_);
  tended_.insert(tended_.end(), again.begin(), again.end());
  return next;
}

}  // namespace kvferry::detail
