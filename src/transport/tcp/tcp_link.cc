#include "transport/tcp/tcp_link.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "transport/tcp/tcp_lane.h"

namespace kvferry::detail {

TcpLink::TcpLink(TcpLinkOptions options) : options_(std::move(options)) {
  lanes_.resize(std::max(1, options_.lanes));
  connecting_.resize(lanes_.size(), false);
}

TcpLink::~TcpLink() { shutdown(); }

Result<std::shared_ptr<TcpLane>> TcpLink::lane(size_t index, Clock::time_point batch_deadline) {
  std::unique_lock lock(mu_);
  const auto usable = [&] { return lanes_[index] && !lanes_[index]->stale(); };
  // One caller connects a lane at a time, without the lock; the others wait for it, each
  // only until its own batch's deadline.
  while (connecting_[index] && !usable()) {
    if (lanes_cv_.wait_until(lock, batch_deadline) == std::cv_status::timeout &&
        connecting_[index] && !usable()) {
      return Timeout("tcp lane to " + options_.peer_name +
                     " still connecting at the batch deadline");
    }
  }
  if (usable()) return lanes_[index];
  const bool had_connection = lanes_[index] != nullptr;
  connecting_[index] = true;
  lock.unlock();
  const Clock::time_point own_deadline = Clock::now() + options_.connect_timeout;
  const bool batch_bounded = batch_deadline < own_deadline;
  auto fresh = TcpLane::connect(options_, std::min(own_deadline, batch_deadline));
  lock.lock();
  connecting_[index] = false;
  if (fresh.ok()) lanes_[index] = *fresh;
  lock.unlock();
  lanes_cv_.notify_all();
  if (fresh.ok()) return std::move(*fresh);
  // The batch's deadline cut the connection short: its timeout, not a verdict on the peer
  // (the next batch tries again).
  if (batch_bounded && Clock::now() >= batch_deadline &&
      fresh.status().code() == StatusCode::kPeerUnreachable) {
    return Timeout("tcp lane to " + options_.peer_name +
                   " not connected before the batch deadline: " + fresh.status().message());
  }
  // A peer we were connected to and cannot reach again is gone, not "unreachable".
  if (had_connection && fresh.status().code() == StatusCode::kPeerUnreachable) {
    return PeerDisconnected("lost the connection to " + options_.peer_name +
                            " and cannot reconnect: " + fresh.status().message());
  }
  return fresh.status();
}

size_t TcpLink::quiet_lane() {
  {
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < lanes_.size(); ++i) {
      if (lanes_[i] ? lanes_[i]->idle() : !connecting_[i]) return i;
    }
  }
  return next_lane_.fetch_add(1);
}

void TcpLink::shutdown() {
  std::lock_guard lock(mu_);
  for (auto& lane : lanes_) {
    if (lane) lane->close();  // fails what it carries
    lane.reset();
  }
}

Result<TcpDeviceStager*> TcpLink::stager() {
  std::lock_guard lock(stager_mu_);
  if (stager_) return stager_.get();
  if (!options_.device || !options_.device->built()) {
    return NotSupported("tcp to " + options_.peer_name +
                        ": this build has no CUDA, so device memory cannot be staged");
  }
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<CudaMemoryApi> api, options_.device->api());
  KVF_ASSIGN_OR_RETURN(std::shared_ptr<TcpStagingPool> pool, options_.device->pool());
  auto stager = std::make_unique<TcpDeviceStager>(std::move(api), std::move(pool));
  KVF_RETURN_IF_ERROR(stager->start());
  stager_ = std::move(stager);
  return stager_.get();
}

namespace {

bool is_device(const RegionEntry* r) {
  return r != nullptr && r->location.kind == MemoryLocation::Kind::kCuda;
}

// A waiting thread reads its batch's answers on the lane its part was sent on (read_for),
// and a polling one what has arrived of them. Owned by the batch, which it points at without
// owning.
class TcpWaitReader final : public BatchHelper {
 public:
  TcpWaitReader(const std::shared_ptr<TcpLane>& lane, const BatchProgress* batch)
      : lane_(lane), batch_(batch) {}
  void help(Clock::time_point until) override {
    if (std::shared_ptr<TcpLane> lane = lane_.lock()) lane->read_for(batch_, until);
  }
  void collect() override { help(Clock::time_point{}); }

 private:
  std::weak_ptr<TcpLane> lane_;
  const BatchProgress* batch_;
};

}  // namespace

Status TcpLink::post(const BatchPart& part) {
  const size_t lane_count = lanes_.size();
  // Which spans read this engine's device memory (WRITEs, staged by the stager), which land
  // in it (READs, landed by the lane's reader, a buffer-full at a time), and which read the
  // peer's (its receiver stages them). Staged ones are cut at the staging buffer size.
  std::vector<int> source_device(part.spans.size(), -1);
  std::vector<int> target_device(part.spans.size(), -1);
  std::vector<bool> device_sized(part.spans.size(), false);
  // Which spans may go in a vector frame: host memory on both sides (device memory moves in
  // one-range frames only, staged on either side).
  std::vector<bool> packable(part.spans.size(), false);
  bool any_device = false;
  size_t local_hint = 0;
  size_t remote_hint = 0;
  for (size_t i = 0; i < part.spans.size(); ++i) {
    const ResolvedOp& op = part.spans[i];
    if (!part.touches_device) {  // host memory on both sides: no region to look up
      packable[i] = op.length <= kVecOpBytes;
      continue;
    }
    const RegionEntry* l =
        part.local == nullptr
            ? nullptr
            : part.local->find(reinterpret_cast<uint64_t>(op.local), op.length, local_hint);
    const RegionEntry* r = part.remote == nullptr
                               ? nullptr
                               : part.remote->find(op.remote_addr, op.length, remote_hint);
    // A READ of the peer's device memory must fit the peer's staging (answered whole).
    device_sized[i] = op.kind == OpKind::kRead ? is_device(r) : is_device(l);
    if (op.kind == OpKind::kRead && is_device(l)) {
      target_device[i] = l->location.device;
    } else if (is_device(l)) {
      source_device[i] = l->location.device;
      any_device = true;
    }
    packable[i] = op.length <= kVecOpBytes && !is_device(l) && !is_device(r);
  }
  const bool any_landing =
      std::any_of(target_device.begin(), target_device.end(), [](int d) { return d >= 0; });
  if (any_landing) {
    // Checked here, so that nothing is queued when landing cannot work.
    if (!options_.device || !options_.device->built()) {
      return NotSupported("tcp to " + options_.peer_name +
                          ": this build has no CUDA, so a READ cannot land in device memory");
    }
    KVF_RETURN_IF_ERROR(options_.device->api().status());
  }
  TcpDeviceStager* device_stager = nullptr;
  uint64_t staging_bytes = options_.device ? options_.device->buffer_bytes() : kTcpChunkBytes;
  if (any_device) {
    KVF_ASSIGN_OR_RETURN(device_stager, stager());
    KVF_ASSIGN_OR_RETURN(std::shared_ptr<TcpStagingPool> pool, options_.device->pool());
    staging_bytes = pool->buffer_bytes();
  }
  // after_cuda_event orders device copies; a part that reads no local device memory has none
  // to order (another part of the batch may, e.g. on cuda_ipc).
  std::vector<std::vector<TcpChunk>> per_lane(lane_count);
  // Device chunks in op order: the lane each goes to, and the device it reads.
  struct StagedChunk {
    size_t lane = 0;
    int device = 0;
    TcpChunk chunk;
  };
  std::vector<StagedChunk> staged_chunks;
  size_t chunks = 0;
  // A part of up to kOneLaneBytes goes on one lane (quiet_lane); larger ones are cut finer so
  // that every lane carries a share of them, but in at least two chunks of at most
  // kStripeChunkBytes each: a part of 1–4 MiB keeps to two (or few) lanes rather than waking
  // four.
  const bool one_lane = part.bytes <= kOneLaneBytes;
  size_t next = one_lane ? quiet_lane() : next_lane_.fetch_add(1);
  const uint64_t least_chunk =
      std::clamp<uint64_t>((part.bytes + 1) / 2, kTcpMinChunkBytes, kStripeChunkBytes);
  const uint64_t chunk_bytes =
      one_lane ? std::max(part.bytes, kTcpMinChunkBytes)
               : std::clamp<uint64_t>(part.bytes / lane_count, least_chunk, kTcpChunkBytes);
  const size_t first_lane = next % lane_count;
  auto lane_for_chunk = [&] { return one_lane ? first_lane : next++ % lane_count; };
  std::vector<bool> lane_used(lane_count, false);
  // The vector frame being packed: consecutive small ops of one kind, up to kVecMaxEntries
  // and chunk_bytes. A group of one goes as a plain frame (a lone op keeps its fast path).
  TcpChunk group;
  auto close_group = [&] {
    if (group.pieces.empty()) return;
    if (group.pieces.size() == 1) group.pieces.clear();  // local/remote/length are the op's
    const size_t lane_index = lane_for_chunk();
    lane_used[lane_index] = true;
    per_lane[lane_index].push_back(std::move(group));
    ++chunks;
    group = TcpChunk{};
  };
  for (size_t i = 0; i < part.spans.size(); ++i) {
    const ResolvedOp& op = part.spans[i];
    if (packable[i] && op.length != 0) {
      if (!group.pieces.empty() &&
          (group.kind != op.kind || group.pieces.size() == kVecMaxEntries ||
           group.length + op.length > chunk_bytes)) {
        close_group();
      }
      if (group.pieces.empty()) {
        group.batch = part.batch;
        group.kind = op.kind;
        group.local = op.local;
        group.remote_addr = op.remote_addr;
      }
      group.pieces.push_back({op.local, op.remote_addr, op.length});
      group.length += op.length;
      continue;
    }
    close_group();
    const bool staged = source_device[i] >= 0;
    const uint64_t step = device_sized[i] ? std::min(chunk_bytes, staging_bytes) : chunk_bytes;
    for (uint64_t off = 0; off < op.length; off += step) {
      uint64_t n = std::min(step, op.length - off);
      TcpChunk chunk;
      chunk.batch = part.batch;
      chunk.kind = op.kind;
      chunk.local = op.local + off;
      chunk.remote_addr = op.remote_addr + off;
      chunk.length = n;
      chunk.local_device = target_device[i];
      // Every landing chunk waits for the event: they land on several lanes' streams.
      if (target_device[i] >= 0) chunk.after_event = part.after_cuda_event;
      const size_t lane_index = lane_for_chunk();
      lane_used[lane_index] = true;
      if (staged) {
        staged_chunks.push_back({lane_index, source_device[i], std::move(chunk)});
      } else {
        per_lane[lane_index].push_back(std::move(chunk));
      }
      ++chunks;
    }
  }
  close_group();
  if (chunks == 1 && staged_chunks.empty()) {
    for (auto& lane_chunks : per_lane) {
      for (TcpChunk& c : lane_chunks) c.sole = true;
    }
  }
  std::vector<std::shared_ptr<TcpLane>> targets(lane_count);
  for (size_t i = 0; i < lane_count; ++i) {
    if (!lane_used[i]) continue;
    KVF_ASSIGN_OR_RETURN(targets[i], lane(i, part.batch->deadline()));
  }
  part.batch->add_tasks(static_cast<int>(chunks));
  // Device chunks go to the stager in op order; it hands each to its lane once the chunk is
  // in a staging buffer.
  if (device_stager != nullptr) {
    std::vector<DeviceStageJob> jobs;
    jobs.reserve(staged_chunks.size());
    for (StagedChunk& sc : staged_chunks) {
      DeviceStageJob job;
      job.batch = part.batch;
      job.device_src = sc.chunk.local;
      job.length = sc.chunk.length;
      job.device = sc.device;
      job.after_event = jobs.empty() ? part.after_cuda_event : nullptr;
      job.deliver = [weak_lane = std::weak_ptr<TcpLane>(targets[sc.lane]),
                     chunk = std::make_shared<TcpChunk>(std::move(sc.chunk)),
                     peer = options_.peer_name](Result<StagingLease> staged) {
        std::shared_ptr<TcpLane> lane = weak_lane.lock();
        if (staged.ok() && !lane) staged = PeerDisconnected("tcp link to " + peer + " was closed");
        if (!staged.ok()) {
          chunk->batch->finish_task(staged.status());
          return;
        }
        chunk->local = staged->data();
        chunk->staging = std::move(*staged);
        std::vector<TcpChunk> one;
        one.push_back(std::move(*chunk));
        lane->enqueue(one, false);
      };
      jobs.push_back(std::move(job));
    }
    device_stager->enqueue(std::move(jobs));
  }
  // At most one lane sends on this thread, after the others are handed to sending turns on
  // the pool (which run meanwhile), and only a small share (or a one-lane part): a large one
  // would keep the caller in sendmsg.
  size_t here = lane_count;
  for (size_t i = 0; i < lane_count; ++i) {
    uint64_t lane_bytes = 0;
    for (const TcpChunk& c : per_lane[i]) lane_bytes += c.length;
    if (!per_lane[i].empty() && (one_lane || lane_bytes <= kInlineSendBytes)) {
      here = i;
      break;
    }
  }
  for (size_t i = 0; i < lane_count; ++i) {
    if (!per_lane[i].empty() && i != here) targets[i]->enqueue(per_lane[i], false);
  }
  if (here != lane_count) {
    // A one-lane part in host memory: the thread that waits for the batch reads its answers.
    const bool waiter_reads = one_lane && !any_device && !any_landing;
    if (waiter_reads) {
      part.batch->add_helper(std::make_shared<TcpWaitReader>(targets[here], part.batch.get()));
    }
    targets[here]->enqueue(per_lane[here], true, waiter_reads);
  }
  part.batch->mark_posted();
  return Status::Ok();
}

}  // namespace kvferry::detail
