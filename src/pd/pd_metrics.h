// PdMetrics: the counters of one PD endpoint (a PrefillServer or a DecodeClient), kept when
// its options ask for metrics (PrefillServerOptions::metrics, DecodeClientOptions::metrics).
//
// * Requests by final state, counted when the request is final.
// * Transfer latency (prefill only): from the moment the first engine batch of the request
//   is submitted (the first plan of its first chunk starts executing) to the moment the
//   last batch of its last chunk completed — every byte, the aux row and state included, is
//   in decode's memory (tcp: the receiver acknowledged it). It excludes bootstrapping,
//   waiting for decode's pages and for chunks to be produced, and the Success message to
//   decode. Observed for successful requests only.
// * Bootstrap health: prefill's registrations (at start and every heartbeat) and decode's
//   /health polls, by result, and the time of the last success.
//
// Thread-safety: every method may be called concurrently; updates are relaxed atomics.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "core/metrics_histogram.h"
#include "core/net.h"
#include "kvferry/metrics.h"
#include "kvferry/pd/request_state.h"
#include "kvferry/status.h"

namespace kvferry::pd::detail {

class PdMetrics {
 public:
  explicit PdMetrics(std::string role) : role_(std::move(role)) {}

  void on_final(RequestState state) {
    (state == RequestState::kSuccess ? succeeded_ : failed_)
        .fetch_add(1, std::memory_order_relaxed);
  }
  void on_transferred(std::chrono::nanoseconds first_post_to_last_byte) {
    transfer_latency_.observe(first_post_to_last_byte);
  }
  void on_bootstrap(const Status& result);

  // Labelled role=<prefill|decode>, endpoint=<the endpoint's address>.
  MetricsSnapshot snapshot(const std::string& endpoint) const;

 private:
  const std::string role_;
  std::atomic<uint64_t> succeeded_{0};
  std::atomic<uint64_t> failed_{0};
  LatencyHistogram transfer_latency_;
  std::atomic<uint64_t> bootstrap_ok_{0};
  std::atomic<uint64_t> bootstrap_failed_{0};
  std::atomic<int64_t> last_bootstrap_ok_ns_{0};  // system_clock since epoch; 0 = never
};

}  // namespace kvferry::pd::detail
