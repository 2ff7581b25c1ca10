// Model presets and rank setup shared by the demo and its worker processes (pd-prefill,
// pd-decode): each rank allocates one region holding its KV pool and aux rows — shared
// memory from allocate_shared (`--memory shared`), or anonymous memory it maps and registers
// itself (`--memory host`, what serving stacks do; reached from the same host over cma) —
// and hands out pages from a free list.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "host_buffer.h"
#include "kvferry/metrics.h"
#include "kvferry/pd/pd_options.h"
#include "kvferry/transfer_engine.h"
#include "pd/page_pattern.h"
#include "transport/built_transports.h"

namespace kvferry::cli {

enum class ModelKind : uint8_t { kMla = 0, kMha };

struct ModelPreset {
  const char* name;
  ModelKind kind;
  uint32_t layers;
  uint32_t kv_heads;         // MHA: total KV heads
  uint32_t head_dim;         // MHA
  uint32_t dtype_bytes;      // MHA
  uint32_t bytes_per_token;  // MLA, per layer
};

inline constexpr ModelPreset kModelPresets[] = {
    {"deepseek-v3", ModelKind::kMla, 61, 0, 0, 0, 1152},  // (512 + 64) x 2 bytes
    {"llama-3.1-8b", ModelKind::kMha, 32, 8, 128, 2, 0},
    {"tiny-mha", ModelKind::kMha, 4, 4, 16, 2, 0},  // tests: small pages, many requests
    {"tiny-mla", ModelKind::kMla, 4, 0, 0, 0, 64},
};

inline Result<ModelPreset> find_model(const std::string& name) {
  std::string valid;
  for (const ModelPreset& m : kModelPresets) {
    if (name == m.name) return m;
    valid += (valid.empty() ? "" : ", ") + std::string(m.name);
  }
  return InvalidArgument("unknown model '" + name + "' (valid: " + valid + ")");
}

// Free list of page indices. Thread-safe.
class PageAllocator {
 public:
  explicit PageAllocator(uint32_t pages) {
    for (uint32_t p = pages; p-- > 0;) free_.push_back(p);
  }
  Result<std::vector<kv::PageIndex>> allocate(size_t n) {
    std::lock_guard lock(mu_);
    if (n > free_.size()) {
      return OutOfRange(fmt::format("need {} pages, {} free", n, free_.size()));
    }
    std::vector<kv::PageIndex> out(free_.end() - static_cast<ptrdiff_t>(n), free_.end());
    free_.resize(free_.size() - n);
    return out;
  }
  void release(const std::vector<kv::PageIndex>& pages) {
    std::lock_guard lock(mu_);
    free_.insert(free_.end(), pages.begin(), pages.end());
  }

 private:
  std::mutex mu_;
  std::vector<kv::PageIndex> free_;
};

struct RankSetup {
  // --memory host: the mapping (unmapped when the last copy goes); shared memory lives as
  // long as the engine.
  std::shared_ptr<void> host_memory;
  pd::RankBuffers buffers;
  pd::TpRank tp;
  pd::HeadRange heads;
  uint64_t bytes_per_token = 0;  // on this rank, all entries
};

inline constexpr uint64_t kAuxRowBytes = 64;

// Where a rank's KV pool lives (--memory).
enum class PoolMemory : uint8_t { kShared = 0, kHost };

inline Result<PoolMemory> parse_pool_memory(const std::string& name) {
  if (name == "shared") return PoolMemory::kShared;
  if (name == "host") return PoolMemory::kHost;
  return InvalidArgument("--memory " + name + " (valid: shared, host)");
}

// Allocates the rank's KV pool (+ one aux row per page, enough for any request mix).
inline Result<RankSetup> setup_rank(TransferEngine& engine, const ModelPreset& m,
                                    uint32_t page_tokens, uint32_t pool_pages, uint32_t tp_size,
                                    uint32_t tp_rank, PoolMemory memory = PoolMemory::kShared) {
  RankSetup r;
  r.tp = {tp_rank, tp_size, m.kind == ModelKind::kMha ? m.kv_heads : 0};
  r.heads = pd::head_range_for_rank(r.tp.total_kv_heads, tp_size, tp_rank);
  kv::MhaShape mha{m.layers,   page_tokens, std::max(1u, m.kv_heads / tp_size),
                   m.head_dim, m.head_dim,  m.dtype_bytes,
                   pool_pages};
  kv::MlaShape mla{m.layers, page_tokens, m.bytes_per_token, pool_pages};
  const bool is_mla = m.kind == ModelKind::kMla;
  uint64_t kv_bytes = 0;
  if (is_mla) {
    KVF_ASSIGN_OR_RETURN(kv_bytes, kv::KvLayout::region_bytes(mla));
  } else {
    KVF_ASSIGN_OR_RETURN(kv_bytes, kv::KvLayout::region_bytes(mha));
  }
  const uint64_t aux_bytes = kAuxRowBytes * pool_pages;
  uint64_t base = 0;
  if (memory == PoolMemory::kShared) {
    KVF_ASSIGN_OR_RETURN(SharedBuffer pool, engine.allocate_shared(kv_bytes + aux_bytes));
    base = reinterpret_cast<uint64_t>(pool.addr);
  } else {
    KVF_ASSIGN_OR_RETURN(HostBuffer pool,
                         HostBuffer::map("the KV pool", kv_bytes + aux_bytes, false));
    auto mapped = std::make_shared<HostBuffer>(std::move(pool));
    KVF_RETURN_IF_ERROR(engine.register_memory(mapped->data(), mapped->size()));
    base = reinterpret_cast<uint64_t>(mapped->data());
    r.host_memory = std::move(mapped);
  }
  if (is_mla) {
    KVF_ASSIGN_OR_RETURN(r.buffers.layout, kv::KvLayout::mla(mla, base));
    r.bytes_per_token = uint64_t{m.layers} * m.bytes_per_token;
  } else {
    KVF_ASSIGN_OR_RETURN(r.buffers.layout, kv::KvLayout::mha(mha, base));
    r.bytes_per_token = uint64_t{2} * m.layers * mha.kv_heads * m.head_dim * m.dtype_bytes;
  }
  r.buffers.aux = {{base + kv_bytes, aux_bytes, kAuxRowBytes}};
  return r;
}

// Common flags of the worker processes.
struct WorkerArgs {
  std::string model = "deepseek-v3";
  uint32_t page_tokens = 16;
  uint32_t pool_pages = 256;
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  std::string transport = "shm";       // or "auto": the engine routes each op
  std::string memory = "shared";       // PoolMemory
  std::string listen = "127.0.0.1:0";  // the engine's handshake listener (its peer name)
  int heartbeat_ms = 500;
  int bootstrap_timeout_ms = 0;  // 0: PdTimeouts' default
  int waiting_timeout_ms = 0;    // 0: PdTimeouts' default
  int threads = 2;
  std::string metadata = "p2p";   // EngineOptions::metadata_uri
  int metadata_ttl_s = 0;         // 0: EngineOptions' default
  int watch_released_ms = 0;      // decode: watch a failed request's pages after the abort ack
  bool integrity = false;         // PdIntegrity on this worker
  bool corrupt_for_test = false;  // decode: flip a landed byte before verification
};

inline void add_worker_flags(CLI::App* cmd, WorkerArgs& a) {
  cmd->add_option("--model", a.model, "model preset");
  cmd->add_option("--page-tokens", a.page_tokens, "tokens per KV page");
  cmd->add_option("--pool-pages", a.pool_pages, "pages in this rank's KV pool");
  cmd->add_option("--tp-size", a.tp_size, "attention TP size of this instance");
  cmd->add_option("--tp-rank", a.tp_rank, "this rank");
  cmd->add_option("--transport", a.transport,
                  "engine transport: shm, cma, tcp, or auto (routed per op)");
  cmd->add_option("--memory", a.memory,
                  "KV pool memory: shared (allocate_shared) or host (mmap'd and registered)");
  cmd->add_option("--listen", a.listen, "engine handshake listener host:port (port 0: any)");
  cmd->add_option("--heartbeat-ms", a.heartbeat_ms, "heartbeat interval");
  cmd->add_option("--bootstrap-timeout-ms", a.bootstrap_timeout_ms,
                  "fail a request still Bootstrapping after this long (0: the default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--waiting-timeout-ms", a.waiting_timeout_ms,
                  "decode: fail (and abort) a request still Transferring after this long (0: the "
                  "default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--metadata", a.metadata,
                  "where engines find each other: p2p, etcd://, redis://");
  cmd->add_option("--metadata-ttl-s", a.metadata_ttl_s,
                  "lifetime of the engine's etcd/redis record (0: the default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--watch-released-ms", a.watch_released_ms,
                  "decode: fill a failed request's pages with a watch pattern at the abort ack and "
                  "check it this long before they are reused (reports late writes)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--threads", a.threads, "engine worker threads");
  cmd->add_flag("--integrity", a.integrity,
                "end-to-end page digests: prefill sends them, decode verifies before Success");
  cmd->add_flag("--corrupt-for-test", a.corrupt_for_test,
                "test only: decode flips a byte of each request's first page after it lands and "
                "before verification (with --integrity the request fails as DataCorrupted)");
}

inline pd::PdTimeouts worker_timeouts(const WorkerArgs& a) {
  pd::PdTimeouts t;
  t.heartbeat_interval = std::chrono::milliseconds(a.heartbeat_ms);
  if (a.bootstrap_timeout_ms > 0)
    t.bootstrap_timeout = std::chrono::milliseconds(a.bootstrap_timeout_ms);
  if (a.waiting_timeout_ms > 0) t.waiting_timeout = std::chrono::milliseconds(a.waiting_timeout_ms);
  return t;
}

// The host part of a "host:port" listener ("127.0.0.1:0" -> "127.0.0.1").
inline std::string listen_host(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return colon == std::string::npos ? listen : listen.substr(0, colon);
}

// Transports a demo worker can be told to use between processes ("auto": none forced; ucx
// only where built).
inline constexpr TransportSet kPdWorkerTransports = {TransportKind::kShm, TransportKind::kCma,
                                                     TransportKind::kTcp, TransportKind::kUcx};
inline constexpr std::string_view kAutoTransport = "auto";

// The forced transport of `name` (parsed once, here at the edge), or none for "auto".
// `built` is the set compiled into this binary (a parameter, so a test can ask what a build
// without UCX says).
inline Result<std::optional<TransportKind>> parse_worker_transport(const std::string& name,
                                                                   const TransportSet& built) {
  if (name == kAutoTransport) return std::optional<TransportKind>();
  KVF_ASSIGN_OR_RETURN(TransportKind kind, parse_transport_kind(name));
  if (!kPdWorkerTransports.contains(kind)) {
    return NotSupported("transport " + name +
                        " is not available to the PD workers (valid: shm, cma, tcp, ucx, auto)");
  }
  if (!built.contains(kind)) {
    return NotSupported("transport " + name +
                        " is not built into this kvferry (the build found no UCX: install "
                        "libucx-dev and rebuild, or pass --transport tcp)");
  }
  return std::optional<TransportKind>(kind);
}

inline TransportSet built_transport_set() {
  TransportSet built;
  for (const BuiltTransport& t : built_transports()) built.insert(t.kind);
  return built;
}

// An engine restricted to the chosen transport, or routing each op itself ("auto"). Metrics
// on: the prefill worker reports the bytes each transport carried. ucx: emulated put/get
// (UCX's tcp, shared memory) still needs KVFERRY_UCX_ALLOW_EMULATED=1.
inline Result<std::unique_ptr<TransferEngine>> make_worker_engine(const WorkerArgs& a,
                                                                  const std::string& name) {
  KVF_ASSIGN_OR_RETURN(std::optional<TransportKind> kind,
                       parse_worker_transport(a.transport, built_transport_set()));
  KVF_RETURN_IF_ERROR(parse_pool_memory(a.memory).status());
  EngineOptions options;
  options.name = name;
  options.listen_address = a.listen;
  options.worker_threads = a.threads;
  options.forced_transport = kind;
  options.metadata_uri = a.metadata;
  if (a.metadata_ttl_s > 0) options.metadata_ttl = std::chrono::seconds(a.metadata_ttl_s);
  options.metrics = true;
  return TransferEngine::create(options);
}

// Bytes each transport carried, from the engine's metrics: {"cma": N, ...} (non-zero only).
inline nlohmann::json transport_bytes(const TransferEngine& engine) {
  nlohmann::json out = nlohmann::json::object();
  const MetricsSnapshot m = engine.metrics();
  for (TransportKind kind : kAllTransportKinds) {
    const std::string name(transport_kind_name(kind));
    const double bytes = m.value("kvferry_engine_bytes_total", {{"transport", name}});
    if (bytes > 0) out[name] = static_cast<uint64_t>(bytes);
  }
  return out;
}

}  // namespace kvferry::cli
