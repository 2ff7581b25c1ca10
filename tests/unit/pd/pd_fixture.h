// In-process PD setups for session tests: engines with shared KV pools, a bootstrap server,
// prefill servers and decode clients, all on loopback.
#pragma once

#include <memory>
#include <vector>

#include "kvferry/pd/bootstrap.h"
#include "kvferry/pd/decode_client.h"
#include "kvferry/pd/prefill_server.h"
#include "pd/page_pattern.h"
#include "test_support.h"

namespace kvferry::pd::testing {

using kvferry::testing::must;

struct ModelShape {
  bool mla = false;
  uint32_t layers = 3;
  uint32_t page_tokens = 4;
  uint32_t total_kv_heads = 4;  // MHA
  uint32_t head_dim = 8;
  uint32_t pages = 32;
};

// A tensor-parallel pairing: MLA or MHA, prefill TP size, decode TP size.
struct TpCase {
  bool mla;
  uint32_t prefill_tp;
  uint32_t decode_tp;
};

struct TestRank {
  std::unique_ptr<TransferEngine> engine;
  RankBuffers buffers;
  TpRank tp;
  HeadRange heads;
};

inline TestRank make_rank(const std::string& name, const ModelShape& m, uint32_t tp_size,
                          uint32_t tp_rank, std::optional<std::string> secret = {}) {
  TestRank r;
  r.engine = kvferry::testing::make_engine(name, 2, std::move(secret));
  r.tp = {tp_rank, tp_size, m.mla ? 0 : m.total_kv_heads};
  r.heads = head_range_for_rank(r.tp.total_kv_heads, tp_size, tp_rank);
  uint64_t kv_bytes = 0;
  kv::MhaShape mha{m.layers,   m.page_tokens, std::max(1u, m.total_kv_heads / tp_size),
                   m.head_dim, m.head_dim,    2,
                   m.pages};
  kv::MlaShape mla{m.layers, m.page_tokens, 72, m.pages};
  kv_bytes = m.mla ? must(kv::KvLayout::region_bytes(mla)) : must(kv::KvLayout::region_bytes(mha));
  const uint64_t aux_bytes = 64 * 16;
  const uint64_t state_bytes = 256 * 16;
  SharedBuffer pool = must(r.engine->allocate_shared(kv_bytes + aux_bytes + state_bytes));
  const auto base = reinterpret_cast<uint64_t>(pool.addr);
  r.buffers.layout =
      m.mla ? must(kv::KvLayout::mla(mla, base)) : must(kv::KvLayout::mha(mha, base));
  r.buffers.aux = {{base + kv_bytes, aux_bytes, 64}};
  if (tp_size == 1) r.buffers.state = {{{base + kv_bytes + aux_bytes, state_bytes, 256}, 8}};
  return r;
}

inline PdTimeouts fast_timeouts() {
  PdTimeouts t;
  t.heartbeat_interval = std::chrono::milliseconds(100);
  t.bootstrap_timeout = std::chrono::milliseconds(3000);
  t.waiting_timeout = std::chrono::milliseconds(5000);
  return t;
}

inline PrefillServerOptions prefill_options(TestRank& r, const std::string& bootstrap,
                                            PdTimeouts timeouts = fast_timeouts()) {
  PrefillServerOptions o;
  o.engine = r.engine.get();
  o.buffers = r.buffers;
  o.tp = r.tp;
  o.bootstrap_address = bootstrap;
  o.timeouts = timeouts;
  return o;
}

inline std::unique_ptr<PrefillServer> make_prefill(TestRank& r, const std::string& bootstrap,
                                                   bool metrics = false,
                                                   PdTimeouts timeouts = fast_timeouts()) {
  PrefillServerOptions o = prefill_options(r, bootstrap, timeouts);
  o.metrics = metrics;
  return must(PrefillServer::create(std::move(o)));
}

inline std::unique_ptr<DecodeClient> make_decode(TestRank& r, PdTimeouts timeouts = fast_timeouts(),
                                                 bool metrics = false) {
  DecodeClientOptions o;
  o.metrics = metrics;
  o.engine = r.engine.get();
  o.buffers = r.buffers;
  o.tp = r.tp;
  o.timeouts = timeouts;
  return must(DecodeClient::create(std::move(o)));
}

inline std::vector<kv::PageIndex> pages_from(kv::PageIndex first, size_t n, uint32_t step = 1) {
  std::vector<kv::PageIndex> p;
  for (size_t i = 0; i < n; ++i) p.push_back(first + static_cast<kv::PageIndex>(i * step));
  return p;
}

}  // namespace kvferry::pd::testing
