#include "engine/engine_metrics.h"

#include <string_view>

namespace kvferry::detail {
namespace {

constexpr std::array<std::string_view, EngineMetrics::kDirections> kDirectionNames = {"write",
                                                                                      "read"};
constexpr std::array<std::string_view, kNotifyHoldBackReasons> kHoldBackNames = {"sender_share",
                                                                                 "inbox_full"};
constexpr std::array<std::string_view, kNotifyDropKinds> kDropNames = {"unacknowledged",
                                                                       "sender_lost"};

MetricFamily family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

MetricPoint point(MetricLabels labels, double value) {
  MetricPoint p;
  p.labels = std::move(labels);
  p.value = value;
  return p;
}

}  // namespace

TransportMask EngineMetrics::on_submitted(size_t ops_submitted, const ResolvedBatch& work) {
  TransportMask mask = 0;
  uint64_t spans = 0;
  for (const ResolvedPart& part : work.parts) {
    const auto t = static_cast<size_t>(part.transport);
    mask |= static_cast<TransportMask>(1u << t);
    std::array<uint64_t, kDirections> bytes{};
    for (const ResolvedOp& op : part.spans) bytes[static_cast<size_t>(op.kind)] += op.length;
    for (size_t d = 0; d < kDirections; ++d) {
      if (bytes[d] == 0) continue;
      bytes_[t][d].fetch_add(bytes[d], std::memory_order_relaxed);
      parts_[t][d].fetch_add(1, std::memory_order_relaxed);
    }
    spans += part.spans.size();
  }
  ops_submitted_.fetch_add(ops_submitted, std::memory_order_relaxed);
  ops_posted_.fetch_add(spans, std::memory_order_relaxed);
  batches_submitted_.fetch_add(1, std::memory_order_relaxed);
  in_flight_.fetch_add(1, std::memory_order_relaxed);
  return mask;
}

void EngineMetrics::on_final(TransportMask transports, const Status& status,
                             std::chrono::nanoseconds elapsed) {
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  if (!status.ok()) {
    failures_[static_cast<size_t>(status.code())].fetch_add(1, std::memory_order_relaxed);
    return;
  }
  for (size_t t = 0; t < kTransports; ++t) {
    if ((transports & (1u << t)) == 0) continue;
    completed_[t].fetch_add(1, std::memory_order_relaxed);
    latency_[t].observe(elapsed);
  }
}

void EngineMetrics::on_notification_held_back(NotifyHoldBack reason) {
  notifications_held_back_[static_cast<size_t>(reason)].fetch_add(1, std::memory_order_relaxed);
}

void EngineMetrics::on_notification_dropped(NotifyDrop what) {
  notifications_dropped_[static_cast<size_t>(what)].fetch_add(1, std::memory_order_relaxed);
}

MetricsSnapshot EngineMetrics::snapshot(const std::string& engine, const RegionIndex& regions,
                                        PeerCounts peers) const {
  auto relaxed = [](const auto& c) {
    return static_cast<double>(c.load(std::memory_order_relaxed));
  };
  auto labels = [&](std::initializer_list<std::pair<std::string, std::string>> more) {
    MetricLabels l{{"engine", engine}};
    l.insert(l.end(), more.begin(), more.end());
    return l;
  };
  MetricsSnapshot out;
  MetricFamily bytes = family("kvferry_engine_bytes_total",
                              "Bytes of validated batches handed to a transport, by direction",
                              MetricType::kCounter);
  MetricFamily parts =
      family("kvferry_engine_batches_total",
             "Batches (one count per transport and direction a batch uses) handed to a transport",
             MetricType::kCounter);
  MetricFamily completed =
      family("kvferry_engine_batches_completed_total",
             "Batches that completed, per transport they used", MetricType::kCounter);
  MetricFamily latency = family("kvferry_engine_batch_latency_seconds",
                                "Completed batches: from submit() to the last byte in the "
                                "destination's memory, per transport the batch used",
                                MetricType::kHistogram);
  latency.bucket_bounds = LatencyHistogram::bounds_seconds();
  for (TransportKind kind : kAllTransportKinds) {
    const auto t = static_cast<size_t>(kind);
    const std::string name(transport_kind_name(kind));
    for (size_t d = 0; d < kDirections; ++d) {
      const std::string dir(kDirectionNames[d]);
      bytes.points.push_back(
          point(labels({{"transport", name}, {"direction", dir}}), relaxed(bytes_[t][d])));
      parts.points.push_back(
          point(labels({{"transport", name}, {"direction", dir}}), relaxed(parts_[t][d])));
    }
    completed.points.push_back(point(labels({{"transport", name}}), relaxed(completed_[t])));
    latency.points.push_back(latency_[t].to_point(labels({{"transport", name}})));
  }
  MetricFamily failures =
      family("kvferry_engine_batch_failures_total",
             "Batches that ended in an error, by status code", MetricType::kCounter);
  for (size_t c = 1; c < kStatusCodes; ++c) {
    failures.points.push_back(
        point(labels({{"code", std::string(status_code_name(static_cast<StatusCode>(c)))}}),
              relaxed(failures_[c])));
  }
  MetricFamily ops = family("kvferry_engine_ops_total",
                            "Ops: as submitted by callers, and as posted to transports after "
                            "merging contiguous ones",
                            MetricType::kCounter);
  ops.points.push_back(point(labels({{"stage", "submitted"}}), relaxed(ops_submitted_)));
  ops.points.push_back(point(labels({{"stage", "posted"}}), relaxed(ops_posted_)));
  MetricFamily submitted = family("kvferry_engine_batches_submitted_total",
                                  "Batches that passed validation", MetricType::kCounter);
  submitted.points.push_back(point(labels({}), relaxed(batches_submitted_)));
  MetricFamily in_flight = family("kvferry_engine_batches_in_flight",
                                  "Batches submitted and not yet final", MetricType::kGauge);
  in_flight.points.push_back(point(labels({}), relaxed(in_flight_)));

  MetricFamily registered = family("kvferry_engine_registered_bytes",
                                   "Registered memory, by memory kind", MetricType::kGauge);
  std::array<uint64_t, kMemoryKindCount> by_kind{};
  for (const RegionEntry& r : regions.entries()) by_kind[static_cast<size_t>(r.kind())] += r.length;
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    registered.points.push_back(
        point(labels({{"memory", std::string(memory_kind_name(static_cast<MemoryKind>(k)))}}),
              static_cast<double>(by_kind[k])));
  }
  MetricFamily peer_family =
      family("kvferry_engine_peers",
             "Peers opened (other than this engine's own endpoint), by state", MetricType::kGauge);
  peer_family.points.push_back(
      point(labels({{"state", "connected"}}), static_cast<double>(peers.connected)));
  peer_family.points.push_back(
      point(labels({{"state", "disconnected"}}), static_cast<double>(peers.disconnected)));

  MetricFamily held_back =
      family("kvferry_engine_notifications_held_back_total",
             "Received notifications that waited, unacknowledged and their connection unread, "
             "because their sender held its share of the inbox or the inbox was full",
             MetricType::kCounter);
  for (size_t r = 0; r < kNotifyHoldBackReasons; ++r) {
    held_back.points.push_back(point(labels({{"reason", std::string(kHoldBackNames[r])}}),
                                     relaxed(notifications_held_back_[r])));
  }
  MetricFamily dropped =
      family("kvferry_engine_notifications_dropped_total",
             "Inbox entries not kept: notifications read but not yet acknowledged when their "
             "connection ended, and sender-lost entries without room",
             MetricType::kCounter);
  for (size_t d = 0; d < kNotifyDropKinds; ++d) {
    dropped.points.push_back(
        point(labels({{"what", std::string(kDropNames[d])}}), relaxed(notifications_dropped_[d])));
  }

  for (MetricFamily* f : {&bytes, &parts, &completed, &latency, &failures, &ops, &submitted,
                          &in_flight, &registered, &peer_family, &held_back, &dropped}) {
    out.families.push_back(std::move(*f));
  }
  return out;
}

}  // namespace kvferry::detail
