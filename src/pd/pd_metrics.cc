#include "pd/pd_metrics.h"

namespace kvferry::pd::detail {

void PdMetrics::on_bootstrap(const Status& result) {
  if (!result.ok()) {
    bootstrap_failed_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  bootstrap_ok_.fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  last_bootstrap_ok_ns_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count(),
                              std::memory_order_relaxed);
}

MetricsSnapshot PdMetrics::snapshot(const std::string& endpoint) const {
  auto labels = [&](std::initializer_list<std::pair<std::string, std::string>> more) {
    MetricLabels l{{"role", role_}, {"endpoint", endpoint}};
    l.insert(l.end(), more.begin(), more.end());
    return l;
  };
  auto point = [](MetricLabels l, double v) {
    MetricPoint p;
    p.labels = std::move(l);
    p.value = v;
    return p;
  };
  auto load = [](const auto& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
  MetricsSnapshot out;
  MetricFamily requests{
      "kvferry_pd_requests_total", "PD requests by final state", MetricType::kCounter, {}, {}};
  requests.points.push_back(
      point(labels({{"state", std::string(request_state_name(RequestState::kSuccess))}}),
            load(succeeded_)));
  requests.points.push_back(point(
      labels({{"state", std::string(request_state_name(RequestState::kFailed))}}), load(failed_)));
  out.families.push_back(std::move(requests));
  if (role_ == "prefill") {
    MetricFamily latency{"kvferry_pd_transfer_latency_seconds",
                         "Successful requests: from the first engine batch submitted to the "
                         "last byte in decode's memory",
                         MetricType::kHistogram,
                         LatencyHistogram::bounds_seconds(),
                         {}};
    latency.points.push_back(transfer_latency_.to_point(labels({})));
    out.families.push_back(std::move(latency));
  }
  MetricFamily bootstrap{"kvferry_pd_bootstrap_checks_total",
                         "Bootstrap server contacts (prefill: registrations, decode: /health "
                         "polls) by result",
                         MetricType::kCounter,
                         {},
                         {}};
  bootstrap.points.push_back(point(labels({{"result", "ok"}}), load(bootstrap_ok_)));
  bootstrap.points.push_back(point(labels({{"result", "failed"}}), load(bootstrap_failed_)));
  out.families.push_back(std::move(bootstrap));
  MetricFamily last{"kvferry_pd_bootstrap_last_ok_timestamp_seconds",
                    "Unix time of the last successful bootstrap contact (0: never)",
                    MetricType::kGauge,
                    {},
                    {}};
  last.points.push_back(point(labels({}), load(last_bootstrap_ok_ns_) * 1e-9));
  out.families.push_back(std::move(last));
  return out;
}

}  // namespace kvferry::pd::detail
