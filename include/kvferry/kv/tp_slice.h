// Tensor-parallel slicing when prefill and decode run attention with different TP sizes.
//
// Follows sglang's Mooncake connector (send_kvcache_slice, _send_mamba_state_slice and the
// decode receiver's rank mapping):
//  * rank mapping: with P == D decode rank d reads prefill rank d; with D > P it reads
//    prefill rank d / (D / P); with P > D it reads prefill ranks [d * (P/D), (d+1) * (P/D)).
//  * KV heads, with H total KV heads: heads per rank are max(1, H / TP) on each side.
//    P > D (gather): the prefill rank sends all its heads (src_head_start 0); GQA replication
//    r = max(1, P / H) makes r consecutive prefill ranks hold the same heads, so they land at
//    dst_head_start = (prefill_rank / r * src_heads) % dst_heads.
//    P <= D (scatter): the decode rank takes dst_heads heads starting at
//    src_head_start = (decode_rank / r' * dst_heads) % src_heads with r' = max(1, D / H),
//    i.e. consecutive decode ranks share a head by integer division, not modulo.
//  * Mamba state, along its TP-sharded dimension (src_dim / dst_dim entries on each rank):
//    P > D: send all src_dim at dst_dim_start = (prefill_rank % (P/D)) * src_dim;
//    P <= D: send dst_dim starting at src_dim_start = (decode_rank * dst_dim) % src_dim.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "kvferry/status.h"

namespace kvferry::kv {

// The attention TP sizes of both sides and the pair of ranks one transfer connects.
struct TpPair {
  uint32_t prefill_tp_size = 1;
  uint32_t prefill_tp_rank = 0;
  uint32_t decode_tp_size = 1;
  uint32_t decode_tp_rank = 0;
};

// Validates sizes > 0, ranks < sizes and that the larger size is a multiple of the smaller.
Status validate_tp_pair(const TpPair& tp);

// The prefill ranks a decode rank reads from (one unless P > D). Errors as validate_tp_pair.
Result<std::vector<uint32_t>> prefill_ranks_for_decode_rank(uint32_t prefill_tp_size,
                                                            uint32_t decode_tp_size,
                                                            uint32_t decode_tp_rank);

struct HeadSlice {
  uint32_t src_head_start = 0;  // first head taken from the prefill rank's token slot
  uint32_t num_heads = 0;
  uint32_t dst_head_start = 0;  // first head written in the decode rank's token slot
  uint32_t src_heads_per_rank = 0;
  uint32_t dst_heads_per_rank = 0;

  friend bool operator==(const HeadSlice&, const HeadSlice&) = default;
};

// The head slice the prefill rank sends to the decode rank. Errors: InvalidArgument for a
// bad TP pair, total_kv_heads 0, or a prefill rank that does not feed this decode rank.
Result<HeadSlice> compute_head_slice(const TpPair& tp, uint32_t total_kv_heads);

struct DimSlice {
  uint64_t src_dim_start = 0;
  uint64_t num_dims = 0;
  uint64_t dst_dim_start = 0;

  friend bool operator==(const DimSlice&, const DimSlice&) = default;
};

// The slice of a TP-sharded state dimension (src_dim entries on the prefill rank, dst_dim
// on the decode rank) the prefill rank sends. Errors: InvalidArgument for a bad TP pair, a
// zero dimension, or a prefill rank that does not feed this decode rank.
Result<DimSlice> compute_state_dim_slice(const TpPair& tp, uint64_t src_dim, uint64_t dst_dim);

}  // namespace kvferry::kv
