#include <fmt/format.h>

#include <algorithm>

#include "engine/engine_impl.h"

namespace kvferry::detail {
namespace {

// A peer's routes as the resolver asks for them.
class PeerRoutes final : public RouteSource {
 public:
  PeerRoutes(PeerState& peer,
             const std::array<std::unique_ptr<Transport>, kAllTransportKinds.size()>& transports)
      : peer_(peer), transports_(transports) {}
  Result<RouteTarget> route(RouteKey key) override {
    const Route& r = peer_.routes.get(key);
    if (!r.transport) return NotSupported(r.reason);
    const Transport* t = transports_[static_cast<size_t>(*r.transport)].get();
    return RouteTarget{*r.transport, t->capabilities().access};
  }

 private:
  PeerState& peer_;
  const std::array<std::unique_ptr<Transport>, kAllTransportKinds.size()>& transports_;
};

}  // namespace

Result<BatchHandle> EngineImpl::submit(const PeerHandle& handle, std::span<const TransferOp> ops,
                                       const SubmitOptions& options) {
  if (!handle.valid()) return InvalidArgument("submit: invalid peer handle");
  if (options.timeout.count() < 0 || options.timeout > kMaxBatchTimeout) {
    return InvalidArgument(fmt::format("submit: timeout {} ms out of range 0..{} ms",
                                       options.timeout.count(), kMaxBatchTimeout.count()));
  }
  const std::shared_ptr<PeerState>& peer = handle.state_;
  if (peer->is_disconnected()) {
    return PeerDisconnected("peer " + peer->name + " disconnected: " + peer->disconnect_reason());
  }
  // Owned as the BatchProgress the transports see, so handing it to them costs no copy.
  std::shared_ptr<BatchProgress> owner = std::make_shared<BatchRecord>(
      peer->liveness, options.timeout.count() > 0 ? options.timeout : options_.batch_timeout);
  BatchRecord* batch = static_cast<BatchRecord*>(owner.get());
  batch->local_snapshot = local_regions_.load();
  if (ops.size() >= SpanRecycler::kMinSpans) {
    batch->recycler = span_recycler_;
    batch->work.parts.lend(span_recycler_->take(ops.size()));
  }
  PeerRoutes routes(*peer, transports_);
  ResolveOutcome resolved;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!peer->is_self) batch->remote_snapshot = peer->segment.load();
    const RegionIndex& remote =
        peer->is_self ? *batch->local_snapshot : batch->remote_snapshot->regions;
    resolved = resolve_ops(ops, *batch->local_snapshot, remote, peer->name, options_.merge_ops,
                           routes, batch->work);
    // A remote miss may be a region the peer registered after we cached its descriptor.
    if (!resolved.remote_miss || peer->is_self || attempt == 1) break;
    batch->work = ResolvedBatch();
    KVF_RETURN_IF_ERROR(refresh_peer(*peer, batch->deadline()));
  }
  KVF_RETURN_IF_ERROR(resolved.status);
  KVF_RETURN_IF_ERROR(check_disjoint_destinations(ops, peer->is_self));
  if (options.after_cuda_event != nullptr) {
    const bool device_part =
        std::any_of(batch->work.parts.begin(), batch->work.parts.end(), [&](const ResolvedPart& p) {
          const CopyAccess access = transport(p.transport)->capabilities().access;
          return access == CopyAccess::kDevicePointers ||
                 (access == CopyAccess::kStagedRemoteAddress && p.touches_device);
        });
    if (!device_part) {
      return InvalidArgument(fmt::format(
          "submit: after_cuda_event is honoured only by device copies, and this batch runs on {} "
          "(no op touches device memory)",
          transport_kind_name(batch->work.parts.front().transport)));
    }
  }
  // Checked before anything is pinned or posted: a batch whose notification cannot go moves
  // no byte.
  if (options.notification) {
    Result<std::shared_ptr<NotificationSender>> notifier =
        notification_sender(*peer, options.notification->size());
    if (!notifier.ok()) return notifier.status();
    batch->notifier = std::move(*notifier);
    batch->notification = *options.notification;
    batch->notified = std::make_shared<NotifyTicket>();
    batch->awaits_notification =
        options.notification_completion == NotificationCompletion::kAcknowledged;
    batch->report_final();
  }
  // Pin the local regions (see RegionUse for the protocol).
  std::vector<RegionUse*>& uses = batch->work.uses;
  for (size_t i = 0; i < uses.size(); ++i) {
    uses[i]->in_flight.fetch_add(1);
    if (uses[i]->removed.load()) {
      for (size_t k = 0; k <= i; ++k) uses[k]->in_flight.fetch_sub(1);
      return NotRegistered("a local region of this batch was unregistered while submitting");
    }
  }
  batch->set_work(ops.size(), batch->work.span_count(), batch->work.bytes, std::move(uses));
  if (metrics_ != nullptr) {
    batch->transports = metrics_->on_submitted(ops.size(), batch->work);
    batch->metrics = metrics_.get();
    batch->report_final();
  }
  KVF_RETURN_IF_ERROR(post_parts(owner, *peer, options.after_cuda_event));
  return BatchHandle(std::move(owner));
}

Status EngineImpl::post_parts(const std::shared_ptr<BatchProgress>& owner, PeerState& peer,
                              void* after_cuda_event) {
  auto* batch = static_cast<BatchRecord*>(owner.get());
  PartList& parts = batch->work.parts;
  // Split: the batch holds one task of its own until every part is posted, so a part that
  // ends at once cannot make it final while another is still to be posted.
  const bool split = parts.size() > 1;
  if (split) {
    // Parts that may copy inside post() go last: a part whose post fails then stops the
    // batch before this thread moved any byte of it.
    std::stable_partition(parts.begin(), parts.end(), [&](const ResolvedPart& p) {
      return !transport(p.transport)->capabilities().may_copy_in_post;
    });
    batch->add_tasks(1);
  }
  const RegionIndex* local = batch->local_snapshot.get();
  const RegionIndex* remote = peer.is_self ? local : &batch->remote_snapshot->regions;
  for (ResolvedPart& part : parts) {
    BatchPart posted{owner,  part.spans,       part.bytes,       local,
                     remote, peer.incarnation, after_cuda_event, part.touches_device};
    TransportLink* link = peer.link(part.transport);
    Status s = link != nullptr
                   ? link->post(posted)
                   : Internal(fmt::format("no {} link to peer {}",
                                          transport_kind_name(part.transport), peer.name));
    if (!s.ok()) {
      if (s.code() == StatusCode::kPeerDisconnected) peer.mark_disconnected(s.message());
      // Nothing of this part started; parts posted before it stop now (nothing of them lands
      // after this returns), and the batch unpins once they have.
      batch->stop(s);
      if (split) batch->finish_task(s);
      return s;
    }
  }
  if (split) batch->finish_task(Status::Ok());
  return Status::Ok();
}

void EngineImpl::enforce_deadline(BatchRecord& b) {
  if (Clock::now() < b.deadline()) return;
  b.stop(Timeout(fmt::format("batch exceeded its timeout of {} ms", b.timeout().count())));
}

BatchStatus EngineImpl::status(const BatchHandle& handle) const {
  if (!handle.valid()) {
    return BatchStatus{BatchState::kFailed, InvalidArgument("status: invalid batch handle"), {}};
  }
  auto& b = static_cast<BatchRecord&>(*handle.state_);
  BatchStatus s = b.snapshot();
  if (s.state != BatchState::kPending) return with_notification(b, std::move(s));
  b.collect();  // answers that have arrived complete the batch now, not at a reading turn
  enforce_deadline(b);
  return with_notification(b, b.snapshot());
}

BatchStatus EngineImpl::with_notification(const BatchRecord& b, BatchStatus s) {
  if (s.state != BatchState::kCompleted || !b.awaits_notification) return s;
  std::optional<Status> outcome = b.notified->poll();
  if (!outcome) {
    s.state = BatchState::kPending;
  } else if (!outcome->ok()) {
    s.state = BatchState::kFailed;
    s.status = *outcome;
  }
  return s;
}

BatchStatus EngineImpl::wait(const BatchHandle& handle, std::chrono::milliseconds timeout) const {
  if (!handle.valid()) {
    return BatchStatus{BatchState::kFailed, InvalidArgument("wait: invalid batch handle"), {}};
  }
  auto& b = static_cast<BatchRecord&>(*handle.state_);
  // Saturating: wait(h, milliseconds::max()) must not overflow the clock.
  const auto now = Clock::now();
  const auto until = timeout >= b.deadline() - now ? b.deadline() : now + timeout;
  if (timeout.count() > 0) b.help(until);
  b.wait_until(until);
  enforce_deadline(b);
  BatchStatus s = b.snapshot();
  if (s.state == BatchState::kCompleted && b.awaits_notification) b.notified->wait_until(until);
  return with_notification(b, std::move(s));
}

MetricsSnapshot EngineImpl::metrics() {
  if (metrics_ == nullptr) return {};
  EngineMetrics::PeerCounts peers;
  {
    std::lock_guard lock(peers_mu_);
    for (const auto& [name, peer] : peers_) {
      ++(peer->is_disconnected() ? peers.disconnected : peers.connected);
    }
  }
  return metrics_->snapshot(options_.name, *local_regions_.load(), peers);
}

void EngineImpl::cancel(const BatchHandle& handle) {
  if (!handle.valid()) return;
  static_cast<BatchRecord&>(*handle.state_).stop(Cancelled("batch cancelled by the caller"));
}

}  // namespace kvferry::detail
