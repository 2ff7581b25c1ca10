// The pd axis of `kvferry bench scale` (bench_scale.h): one-page requests through the PD
// session layer, N in flight, against the engine moving the same page.
//
// One process holds a bootstrap server, a prefill engine with its PrefillServer and a decode
// engine with its DecodeClient (their KV pools: pd_model.h's setup_rank, --pd-model pages of
// --pd-page-tokens tokens; the engines route over shm, as two ranks of one host do). A wave
// is N requests at once: request i sends prefill page i to decode page i. Its pages are
// filled with the request's pattern (pd/page_pattern.h) before the clock starts; the clock
// runs from the first create_receiver to the last receiver's Success: every receiver created
// and init'ed, every sender created, waited to WaitingForInput and sent its page. Then every
// page is verified (count_corrupt_pages), off the clock.
//
// The reference, in the same loop (one reference transfer, then one wave, for --min-time-ms):
// the prefill engine moving the same page to the decode engine itself, through the planner
// (build_transfer_plan with the transport's default strategy, kv::execute) — the bytes of a
// request without the session layer. Per point: wave p50, requests/s (N ÷ wave p50), time per
// request (wave p50 ÷ N), the overhead per request over the reference (time per request −
// reference p50: at N = 1 the latency the PD layer adds), and decode's transfer_time p50
// (TransferRequest sent to Success).
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <span>
#include <vector>

#include "bench_scale.h"
#include "bench_util.h"
#include "kvferry/kv/plan_executor.h"
#include "kvferry/kv/planner.h"
#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/decode_client.h"
#include "kvferry/pd/prefill_server.h"
#include "kvferry/transfer_engine.h"
#include "pd/page_pattern.h"
#include "pd_model.h"

namespace kvferry::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr auto kRequestTimeout = std::chrono::seconds(60);

// Both sides of one PD pairing in this process. Members are destroyed in reverse order: the
// PD layer before the engines it borrows.
struct PdPair {
  std::unique_ptr<pd::BootstrapServer> bootstrap;
  std::unique_ptr<TransferEngine> prefill_engine, decode_engine;
  RankSetup prefill_rank, decode_rank;
  std::unique_ptr<pd::PrefillServer> prefill;
  std::unique_ptr<pd::DecodeClient> decode;
  uint32_t tokens = 0;  // per request: one full page
  uint64_t next_room = 1;
};

Result<std::unique_ptr<PdPair>> make_pd_pair(const ScaleArgs& args, uint32_t pool_pages) {
  KVF_ASSIGN_OR_RETURN(ModelPreset model, find_model(args.pd_model));
  auto p = std::make_unique<PdPair>();
  p->tokens = args.pd_page_tokens;
  KVF_ASSIGN_OR_RETURN(p->bootstrap, pd::BootstrapServer::start({}));
  KVF_ASSIGN_OR_RETURN(p->prefill_engine, make_scale_engine("scale-prefill"));
  KVF_ASSIGN_OR_RETURN(p->decode_engine, make_scale_engine("scale-decode"));
  KVF_ASSIGN_OR_RETURN(p->prefill_rank, setup_rank(*p->prefill_engine, model, args.pd_page_tokens,
                                                   pool_pages, 1, 0));
  KVF_ASSIGN_OR_RETURN(p->decode_rank,
                       setup_rank(*p->decode_engine, model, args.pd_page_tokens, pool_pages, 1, 0));
  pd::PrefillServerOptions prefill;
  prefill.engine = p->prefill_engine.get();
  prefill.buffers = p->prefill_rank.buffers;
  prefill.tp = p->prefill_rank.tp;
  prefill.bootstrap_address = p->bootstrap->address();
  KVF_ASSIGN_OR_RETURN(p->prefill, pd::PrefillServer::create(std::move(prefill)));
  pd::DecodeClientOptions decode;
  decode.engine = p->decode_engine.get();
  decode.buffers = p->decode_rank.buffers;
  decode.tp = p->decode_rank.tp;
  KVF_ASSIGN_OR_RETURN(p->decode, pd::DecodeClient::create(std::move(decode)));
  return p;
}

// One wave of `n` one-page requests (see the file comment). `wave_ns` gets the wave's time,
// `transfer_ns` each request's transfer_time; every page is verified after the clock stops.
Status run_wave(PdPair& p, uint64_t n, double& wave_ns, LatencySampler* transfer_ns) {
  std::vector<uint64_t> rooms(n);
  for (uint64_t i = 0; i < n; ++i) {
    rooms[i] = p.next_room++;
    const kv::PageIndex page = static_cast<kv::PageIndex>(i);
    pd::fill_request_pages(p.prefill_rank.buffers.layout, std::span(&page, 1), p.tokens, rooms[i],
                           p.prefill_rank.heads);
  }
  std::vector<pd::KvReceiver> receivers;
  std::vector<pd::KvSender> senders;
  receivers.reserve(n);
  senders.reserve(n);
  const pd::LastChunkExtras last;
  const auto start = SteadyClock::now();
  for (uint64_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(pd::KvReceiver r,
                         p.decode->create_receiver(p.bootstrap->address(), rooms[i]));
    KVF_RETURN_IF_ERROR(r.init({static_cast<kv::PageIndex>(i)}));
    receivers.push_back(std::move(r));
  }
  for (uint64_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(pd::KvSender s, p.prefill->create_sender(rooms[i]));
    senders.push_back(std::move(s));
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (senders[i].wait_at_least(pd::RequestState::kWaitingForInput, kRequestTimeout) !=
        pd::RequestState::kWaitingForInput) {
      return Status(senders[i].failure().code(),
                    fmt::format("bench scale: pd: room {} never reached WaitingForInput: {}",
                                rooms[i], senders[i].failure().to_string()));
    }
    const kv::PageIndex page = static_cast<kv::PageIndex>(i);
    KVF_RETURN_IF_ERROR(senders[i].send(std::span(&page, 1), &last));
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (receivers[i].wait_final(kRequestTimeout) != pd::RequestState::kSuccess) {
      return Status(receivers[i].failure().code(),
                    fmt::format("bench scale: pd: room {} did not succeed: {}", rooms[i],
                                receivers[i].failure().to_string()));
    }
  }
  wave_ns = ns_since(start);
  for (uint64_t i = 0; i < n; ++i) {
    const kv::PageIndex page = static_cast<kv::PageIndex>(i);
    if (pd::count_corrupt_pages(p.decode_rank.buffers.layout, std::span(&page, 1), p.tokens,
                                rooms[i], p.decode_rank.heads) != 0) {
      return DataCorrupted(fmt::format(
          "bench scale: pd: room {}: decode page {} is not what prefill sent", rooms[i], i));
    }
    if (transfer_ns != nullptr) {
      transfer_ns->add(static_cast<double>(receivers[i].transfer_time().count()));
    }
    // The sender's own Success follows decode's; wait for it so waves do not overlap.
    if (senders[i].wait_final(kRequestTimeout) != pd::RequestState::kSuccess) {
      return Status(senders[i].failure().code(),
                    fmt::format("bench scale: pd: prefill's room {} did not succeed: {}", rooms[i],
                                senders[i].failure().to_string()));
    }
  }
  return Status::Ok();
}

}  // namespace

Status run_pd_axis(const ScaleArgs& args, std::vector<ScalePoint>& out) {
  const uint64_t most =
      *std::max_element(args.requests_in_flight.begin(), args.requests_in_flight.end());
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<PdPair> pair,
                       make_pd_pair(args, static_cast<uint32_t>(most)));
  PdPair& p = *pair;

  // The reference: the same page, prefill page 0 to decode page 0, by the engine alone.
  KVF_ASSIGN_OR_RETURN(PeerHandle to_decode,
                       p.prefill_engine->open_peer(p.decode_engine->endpoint()));
  const kv::PageIndex page0 = 0;
  kv::PlanOptions plan_options;
  plan_options.strategy = kv::default_send_strategy(to_decode.transport());
  KVF_ASSIGN_OR_RETURN(
      kv::TransferPlan plan,
      kv::build_transfer_plan(p.prefill_rank.buffers.layout, p.decode_rank.buffers.layout,
                              std::span(&page0, 1), std::span(&page0, 1), plan_options));
  const std::string transport(transport_kind_name(to_decode.transport()));

  for (const uint64_t n : args.requests_in_flight) {
    LatencySampler engine_ns, wave_ns, transfer_ns;
    const Status measured = repeat_for(args.min_time_ms, [&](bool record) {
      auto start = SteadyClock::now();
      KVF_RETURN_IF_ERROR(kv::execute(plan, *p.prefill_engine, to_decode));
      const double engine_once = ns_since(start);
      double wave_once = 0;
      KVF_RETURN_IF_ERROR(run_wave(p, n, wave_once, record ? &transfer_ns : nullptr));
      if (record) {
        engine_ns.add(engine_once);
        wave_ns.add(wave_once);
      }
      return Status::Ok();
    });
    KVF_RETURN_IF_ERROR(measured);
    engine_ns.finish();
    wave_ns.finish();
    transfer_ns.finish();
    const double requests = static_cast<double>(n);
    const double wave_us = wave_ns.percentile_us(50);
    const double per_request_us = wave_us / requests;
    ScalePoint point{ScaleAxis::kPd, transport, n};
    auto& m = point.metrics;
    m["wave_ms_p50"] = wave_us / 1e3;
    m["requests_per_s"] = requests / wave_us * 1e6;
    m["us_per_request"] = per_request_us;
    m["engine_us_p50"] = engine_ns.percentile_us(50);
    m["overhead_us"] = per_request_us - engine_ns.percentile_us(50);
    m["transfer_us_p50"] = transfer_ns.percentile_us(50);
    m["pages_verified"] = static_cast<uint64_t>(wave_ns.count()) * n;
    add_scale_point(out, std::move(point));
  }
  p.prefill_engine->close_peer(to_decode);
  return Status::Ok();
}

}  // namespace kvferry::cli
