// Options shared by both sides of the PD session layer: heartbeats and timeouts, and what a
// rank registers (its KV layout, aux rows and state buffers).
//
// Thread-safety: plain values.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/send_strategy.h"
#include "kvferry/kv/slot_plan.h"
#include "kvferry/status.h"
#include "kvferry/transfer_types.h"

namespace kvferry::pd {

struct PdTimeouts {
  // Each side sends a Heartbeat on every control connection this often (and decode polls
  // /health of each instance it has a request in flight with); any frame counts as a sign
  // of life.
  std::chrono::milliseconds heartbeat_interval{500};
  // A peer silent for this long is dead and its pending requests fail. Zero = 1.5 x the
  // interval; checked every quarter interval, so a dead peer is noticed within two
  // intervals. A killed peer is noticed at once (its socket closes).
  std::chrono::milliseconds heartbeat_timeout{0};
  // Bootstrapping longer than this fails the request (decode: finding and registering with
  // the prefill ranks; prefill: waiting for decode's destination pages).
  std::chrono::milliseconds bootstrap_timeout{10'000};
  // Decode: Transferring longer than this fails the request and aborts it on prefill.
  std::chrono::milliseconds waiting_timeout{30'000};
  // Prefill: the timeout of each engine call of a chunk.
  std::chrono::milliseconds transfer_call_timeout{10'000};

  std::chrono::milliseconds effective_heartbeat_timeout() const {
    return heartbeat_timeout.count() > 0 ? heartbeat_timeout : heartbeat_interval * 3 / 2;
  }
  std::chrono::milliseconds tick() const {
    return std::max(std::chrono::milliseconds(5), heartbeat_interval / 4);
  }
};

// The KV-side buffers one rank registers: pages, aux rows, state slots.
struct RankBuffers {
  kv::KvLayout layout;
  std::vector<kv::RowBuffer> aux;           // one aux row per request slot
  std::vector<kv::MambaStateTensor> state;  // one state slot per request (hybrid models)
};

// Tensor parallelism of one rank.
struct TpRank {
  uint32_t rank = 0;
  uint32_t size = 1;
  uint32_t total_kv_heads = 0;  // of the model (MHA head slicing); 0 for MLA
};

// Per-chunk planning choices. The strategy defaults to kv::default_send_strategy for the
// peer's transport (a typed TransportKind; never a string compare).
struct SendOptions {
  std::optional<kv::SendStrategy> strategy;
  uint32_t max_pages_per_call = 0;  // only with kIndexSharded
};

// Opt-in end-to-end integrity (off by default): prefill sends an XXH3 digest of what it
// wrote to each destination page with the request's final Success, and decode hashes the
// pages in place before it reports Success; a mismatch fails the request with
// DataCorrupted naming the page. Both sides read the KV pages on the CPU, so KV in device
// memory is refused (NotSupported) when this is enabled. A decode with integrity enabled
// fails a request whose prefill rank sent no digests (FailedPrecondition); a prefill with it
// enabled talking to a decode without it costs only the hashing and the message bytes.
struct PdIntegrity {
  bool enabled = false;
  // Where this rank's KV pages live.
  MemoryLocation::Kind kv_memory = MemoryLocation::Kind::kHost;

  // NotSupported naming why, for integrity on device memory; OK otherwise. `side` names the
  // caller ("prefill server").
  Status check(std::string_view side) const {
    if (!enabled || kv_memory == MemoryLocation::Kind::kHost) return Status::Ok();
    return NotSupported(std::string(side) +
                        ": integrity on KV in device memory: the digests are computed and "
                        "verified by the CPU, which cannot read device memory; disable "
                        "integrity or keep the KV in host memory");
  }
};

}  // namespace kvferry::pd
