#include <fmt/format.h>

#include "engine/engine_impl.h"
#include "transport/tcp/tcp_link.h"

namespace kvferry::detail {

Result<BatchHandle> EngineImpl::submit(const PeerHandle& handle, std::span<const TransferOp> ops,
                                       const SubmitOptions& options) {
  if (!handle.valid()) return InvalidArgument("submit: invalid peer handle");
  if (options.timeout.count() < 0 || options.timeout > kMaxBatchTimeout) {
    return InvalidArgument(fmt::format("submit: timeout {} ms out of range 0..{} ms",
                                       options.timeout.count(), kMaxBatchTimeout.count()));
  }
  const std::shared_ptr<PeerState>& peer = handle.state_;
  auto batch = std::make_shared<BatchRecord>();
  batch->start = Clock::now();
  batch->timeout = options.timeout.count() > 0 ? options.timeout : options_.batch_timeout;
  batch->deadline = batch->start + batch->timeout;
  batch->ops_submitted = ops.size();
  batch->peer = peer->liveness;
  if (peer->is_disconnected()) {
    return PeerDisconnected("peer " + peer->name + " disconnected: " + peer->disconnect_reason());
  }
  batch->local_snapshot = local_regions_.load();
  // The self peer reaches its own device memory with device copies too.
  const CopyAccess access = peer->transport == TransportKind::kTcp ? CopyAccess::kRemoteAddress
                            : peer->transport == TransportKind::kCudaIpc || peer->is_self
                                ? CopyAccess::kDevicePointers
                                : CopyAccess::kHostPointers;
  ResolveOutcome resolved;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!peer->is_self) batch->remote_snapshot = peer->segment.load();
    const RegionIndex& remote =
        peer->is_self ? *batch->local_snapshot : batch->remote_snapshot->regions;
    resolved =
        resolve_ops(ops, *batch->local_snapshot, remote, peer->name, options_.merge_ops, access);
    // A remote miss may be a region the peer registered after we cached its descriptor.
    if (!resolved.remote_miss || peer->is_self || attempt == 1) break;
    KVF_RETURN_IF_ERROR(refresh_peer(*peer));
  }
  KVF_RETURN_IF_ERROR(resolved.status);
  const bool device_copy = resolved.batch.touches_device;
  if (options.after_cuda_event != nullptr && !device_copy) {
    return InvalidArgument(fmt::format(
        "submit: after_cuda_event is honoured only by device copies, and this batch runs on {} "
        "(no op touches device memory)",
        transport_kind_name(peer->transport)));
  }
  DeviceTransport* device = nullptr;
  if (device_copy) {
    // Device memory on either side exists only where the device transport opened.
    KVF_ASSIGN_OR_RETURN(device, device_transport());
  }
  batch->work = std::move(resolved.batch);
  // Pin the local regions (see RegionUse for the protocol).
  for (size_t i = 0; i < batch->work.uses.size(); ++i) {
    RegionUse* use = batch->work.uses[i];
    use->in_flight.fetch_add(1);
    if (use->removed.load()) {
      for (size_t k = 0; k <= i; ++k) batch->work.uses[k]->in_flight.fetch_sub(1);
      return NotRegistered("a local region of this batch was unregistered while submitting");
    }
  }
  if (device_copy) {
    DevicePostContext context{
        batch->local_snapshot.get(),
        peer->is_self ? batch->local_snapshot.get() : &batch->remote_snapshot->regions,
        peer->incarnation, options.after_cuda_event};
    if (Status posted = device->post(batch, context); !posted.ok()) {
      for (RegionUse* use : batch->work.uses) use->in_flight.fetch_sub(1);
      return posted;
    }
  } else if (peer->transport == TransportKind::kTcp) {
    if (Status posted = peer->tcp->post(batch); !posted.ok()) {
      for (RegionUse* use : batch->work.uses) use->in_flight.fetch_sub(1);
      if (posted.code() == StatusCode::kPeerDisconnected) {
        peer->mark_disconnected(posted.message());
      }
      return posted;
    }
  } else {
    copier_.run(batch);
  }
  return BatchHandle(std::move(batch));
}

void EngineImpl::enforce_deadline(BatchRecord& b) {
  if (Clock::now() < b.deadline) return;
  b.stop(Timeout(fmt::format("batch exceeded its timeout of {} ms", b.timeout.count())));
}

BatchStatus EngineImpl::status(const BatchHandle& handle) const {
  if (!handle.valid()) {
    return BatchStatus{BatchState::kFailed, InvalidArgument("status: invalid batch handle"), {}};
  }
  BatchRecord& b = *handle.state_;
  BatchStatus s = b.snapshot();
  if (s.state != BatchState::kPending) return s;
  enforce_deadline(b);
  return b.snapshot();
}

BatchStatus EngineImpl::wait(const BatchHandle& handle, std::chrono::milliseconds timeout) const {
  if (!handle.valid()) {
    return BatchStatus{BatchState::kFailed, InvalidArgument("wait: invalid batch handle"), {}};
  }
  BatchRecord& b = *handle.state_;
  // Saturating: wait(h, milliseconds::max()) must not overflow the clock.
  const auto now = Clock::now();
  const auto until = timeout >= b.deadline - now ? b.deadline : now + timeout;
  if (timeout.count() > 0) CopyExecutor::help(b);
  {
    std::unique_lock lock(b.mu);
    b.cv.wait_until(lock, until, [&] { return b.state != BatchState::kPending; });
  }
  enforce_deadline(b);
  return b.snapshot();
}

void EngineImpl::cancel(const BatchHandle& handle) {
  if (!handle.valid()) return;
  handle.state_->stop(Cancelled("batch cancelled by the caller"));
}

}  // namespace kvferry::detail
