// PD endpoint metrics (PrefillServerOptions::metrics, DecodeClientOptions::metrics): requests
// by final state on both sides, prefill's transfer latency for the request that succeeded,
// bootstrap contacts; nothing without the option.
#include <gtest/gtest.h>

#include <thread>

#include "unit/pd/pd_fixture.h"

namespace kvferry::pd {
namespace {

using namespace std::chrono_literals;
using testing::ModelShape;
using testing::TestRank;

// Polls `read` until it returns `want` or 5 s pass; the last value.
template <typename F>
double eventually(F read, double want) {
  double v = read();
  for (int i = 0; i < 500 && v != want; ++i) {
    std::this_thread::sleep_for(10ms);
    v = read();
  }
  return v;
}

TEST(PdMetrics, CountRequestsByFinalStateTransferLatencyAndBootstrapContacts) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address(), /*metrics=*/true);
  auto decode = testing::make_decode(d, testing::fast_timeouts(), /*metrics=*/true);

  // Room 1 succeeds, every page verified.
  const uint64_t tokens = 4 * m.page_tokens;
  auto src = testing::pages_from(0, 4), dst = testing::pages_from(4, 4);
  fill_request_pages(p.buffers.layout, src, tokens, 1, p.heads);
  KvReceiver ok = testing::must(decode->create_receiver(bootstrap->address(), 1));
  ASSERT_TRUE(ok.init(dst).ok());
  KvSender sender = testing::must(prefill->create_sender(1));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  LastChunkExtras none;
  ASSERT_TRUE(sender.send(src, &none).ok());
  ASSERT_EQ(ok.wait_final(5s), RequestState::kSuccess) << ok.failure().to_string();
  EXPECT_EQ(count_corrupt_pages(d.buffers.layout, dst, tokens, 1, d.heads), 0u);

  // Room 2 is aborted by decode: Failed on both sides.
  KvReceiver aborted = testing::must(decode->create_receiver(bootstrap->address(), 2));
  ASSERT_TRUE(aborted.init(testing::pages_from(8, 4)).ok());
  KvSender s2 = testing::must(prefill->create_sender(2));
  ASSERT_EQ(s2.wait_at_least(RequestState::kWaitingForInput, 5s), RequestState::kWaitingForInput);
  // Decode polls /health every heartbeat while a request of the instance is in flight.
  auto decode_polls = [&] {
    return decode->metrics().value("kvferry_pd_bootstrap_checks_total", {{"result", "ok"}});
  };
  for (int i = 0; i < 500 && decode_polls() < 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(decode_polls(), 1);
  aborted.abort("client went away");
  ASSERT_EQ(s2.wait_final(5s), RequestState::kFailed);

  const MetricLabels success = {{"state", "Success"}}, failed = {{"state", "Failed"}};
  auto prefill_value = [&](const char* name, const MetricLabels& l) {
    return [&, name, l] { return prefill->metrics().value(name, l); };
  };
  auto decode_value = [&](const char* name, const MetricLabels& l) {
    return [&, name, l] { return decode->metrics().value(name, l); };
  };
  EXPECT_EQ(eventually(prefill_value("kvferry_pd_requests_total", success), 1), 1);
  EXPECT_EQ(eventually(prefill_value("kvferry_pd_requests_total", failed), 1), 1);
  EXPECT_EQ(eventually(decode_value("kvferry_pd_requests_total", success), 1), 1);
  EXPECT_EQ(eventually(decode_value("kvferry_pd_requests_total", failed), 1), 1);

  MetricsSnapshot pm = prefill->metrics();
  const MetricPoint* latency =
      pm.find("kvferry_pd_transfer_latency_seconds",
              {{"role", "prefill"}, {"endpoint", prefill->control_endpoint()}});
  ASSERT_NE(latency, nullptr);
  EXPECT_EQ(latency->count, 1u);  // the aborted request never completed a transfer
  EXPECT_GT(latency->sum, 0);
  EXPECT_LT(latency->sum, 5.0);
  EXPECT_GE(pm.value("kvferry_pd_bootstrap_checks_total", {{"result", "ok"}}), 1);
  EXPECT_EQ(pm.value("kvferry_pd_bootstrap_checks_total", {{"result", "failed"}}), 0);
  EXPECT_GT(pm.value("kvferry_pd_bootstrap_last_ok_timestamp_seconds"), 0);
  EXPECT_EQ(decode->metrics().find("kvferry_pd_transfer_latency_seconds"), nullptr);
}

TEST(PdMetrics, OffByDefault) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  EXPECT_TRUE(prefill->metrics().families.empty());
  EXPECT_TRUE(decode->metrics().families.empty());
}

}  // namespace
}  // namespace kvferry::pd
