// BatchRecord: the engine's state for one submitted batch — its completion (BatchProgress,
// which is all a transport sees), the work it was resolved into (one part per transport),
// and the snapshots of both sides' regions that the work's pointers refer to.
//
// Life cycle: submit resolves and pins, then posts every part to its transport; the batch
// ends when every part's tasks have finished (first error wins), or early through stop()
// on cancel or timeout.
//
// Thread-safety: `work` and the snapshots are immutable once posted (a transport may fill
// in ResolvedOp::remote of its own part before it starts); the rest is BatchProgress's.
#pragma once

#include <memory>

#include "engine/engine_metrics.h"
#include "engine/notify_sender.h"
#include "engine/op_resolver.h"
#include "engine/peer_state.h"
#include "engine/span_recycler.h"
#include "transport/batch_progress.h"

namespace kvferry::detail {

struct BatchRecord final : BatchProgress {
  using BatchProgress::BatchProgress;
  using BatchProgress::collect;
  using BatchProgress::help;
  using BatchProgress::report_final;
  using BatchProgress::set_work;
  using BatchProgress::snapshot;
  using BatchProgress::stop;
  using BatchProgress::wait_until;

  ResolvedBatch work;
  std::shared_ptr<const RegionIndex> local_snapshot;     // keeps RegionUse alive
  std::shared_ptr<const RemoteSegment> remote_snapshot;  // keeps mappings alive
  // Metrics on: the engine's counters (they outlive every batch) and the transports used.
  EngineMetrics* metrics = nullptr;
  TransportMask transports = 0;
  // SubmitOptions::notification: sent through `notifier` once the data completed, its
  // outcome in `notified`; with NotificationCompletion::kAcknowledged (`awaits_notification`)
  // the batch is complete when `notified` is OK. Set before posting.
  std::shared_ptr<NotificationSender> notifier;
  std::string notification;
  std::shared_ptr<NotifyTicket> notified;
  bool awaits_notification = false;
  // Where the span storage goes back when the batch is gone (large batches only).
  std::shared_ptr<SpanRecycler> recycler;

  ~BatchRecord() override {
    if (!recycler) return;
    for (ResolvedPart& part : work.parts.slots()) recycler->give(std::move(part.spans));
  }
  BatchRecord(const BatchRecord&) = delete;
  BatchRecord& operator=(const BatchRecord&) = delete;

  void on_final(const Status& status, std::chrono::nanoseconds elapsed) override {
    if (metrics != nullptr) metrics->on_final(transports, status, elapsed);
    if (notified && status.ok()) notifier->enqueue(std::move(notification), deadline(), notified);
  }
};

}  // namespace kvferry::detail
