// EngineMetrics: the counters of one engine (EngineOptions::metrics). The engine holds one
// when metrics are on and none otherwise; every hook is behind that null check.
//
// Hooks: on_submitted when a batch has been resolved and is about to be posted
// (engine_batches.cc), on_final when BatchProgress makes it final (batch_progress.cc, through
// BatchRecord); on_notification_held_back and on_notification_dropped from the notification
// receiver's loop (notify_receiver.cc). All are relaxed atomic increments only.
//
// Windows: batch latency is BatchProgress's complete_time — from the BatchRecord's creation
// at the start of submit() to the moment the last task of the last part finished (the bytes
// are in the destination's memory), observed once per transport the batch used.
//
// Thread-safety: every method may be called concurrently.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "core/metrics_histogram.h"
#include "engine/op_resolver.h"
#include "kvferry/metrics.h"
#include "kvferry/status.h"
#include "kvferry/transport_kind.h"
#include "transport/region_index.h"

namespace kvferry::detail {

// Why a received notification waited, unacknowledged and its connection unread, before it
// went into the inbox (NotificationReceiver).
enum class NotifyHoldBack : uint8_t { kSenderShare, kInboxFull };
inline constexpr size_t kNotifyHoldBackReasons = 2;
// What the notification receiver could not keep: a notification it had read but not yet
// acknowledged when its connection ended (it waited for room), or a sender-lost entry for
// which there was no room.
enum class NotifyDrop : uint8_t { kUnacknowledged, kSenderLost };
inline constexpr size_t kNotifyDropKinds = 2;

// Which transports a batch used, one bit per TransportKind.
using TransportMask = uint8_t;
static_assert(kAllTransportKinds.size() <= 8, "TransportMask holds one bit per transport");

class EngineMetrics {
 public:
  static constexpr size_t kTransports = kAllTransportKinds.size();
  static constexpr size_t kDirections = 2;  // OpKind::kWrite, OpKind::kRead
  static constexpr size_t kStatusCodes = static_cast<size_t>(kLastStatusCode) + 1;

  // The batch passed validation: its ops, spans and bytes per transport and direction.
  // Returns the transports it uses (kept by the batch for on_final).
  TransportMask on_submitted(size_t ops_submitted, const ResolvedBatch& work);
  // The batch ended with `status` after `elapsed` (submit to last byte).
  void on_final(TransportMask transports, const Status& status, std::chrono::nanoseconds elapsed);

  // The notification receiver held a notification back, or dropped an entry.
  void on_notification_held_back(NotifyHoldBack reason);
  void on_notification_dropped(NotifyDrop what);

  struct PeerCounts {
    uint64_t connected = 0;
    uint64_t disconnected = 0;
  };
  // Everything counted, labelled engine=<name>; registered bytes from `regions`.
  MetricsSnapshot snapshot(const std::string& engine, const RegionIndex& regions,
                           PeerCounts peers) const;

 private:
  using Counter = std::atomic<uint64_t>;
  std::array<std::array<Counter, kDirections>, kTransports> bytes_{};
  std::array<std::array<Counter, kDirections>, kTransports> parts_{};
  std::array<Counter, kStatusCodes> failures_{};
  std::array<Counter, kTransports> completed_{};
  std::array<LatencyHistogram, kTransports> latency_{};
  Counter ops_submitted_{0};
  Counter ops_posted_{0};
  Counter batches_submitted_{0};
  std::atomic<int64_t> in_flight_{0};
  std::array<Counter, kNotifyHoldBackReasons> notifications_held_back_{};
  std::array<Counter, kNotifyDropKinds> notifications_dropped_{};
};

}  // namespace kvferry::detail
