// Rank mapping and head / state-dimension slices for prefill TP != decode TP, following
// sglang's Mooncake connector (see the header for the formulas).
#include "kvferry/kv/tp_slice.h"

#include <algorithm>
#include <string>

namespace kvferry::kv {
namespace {

std::string describe(const TpPair& tp) {
  return "prefill TP " + std::to_string(tp.prefill_tp_size) + " rank " +
         std::to_string(tp.prefill_tp_rank) + ", decode TP " + std::to_string(tp.decode_tp_size) +
         " rank " + std::to_string(tp.decode_tp_rank);
}

// Whether the prefill rank is one the decode rank reads from.
Status require_paired(const TpPair& tp) {
  KVF_ASSIGN_OR_RETURN(
      std::vector<uint32_t> sources,
      prefill_ranks_for_decode_rank(tp.prefill_tp_size, tp.decode_tp_size, tp.decode_tp_rank));
  if (std::find(sources.begin(), sources.end(), tp.prefill_tp_rank) != sources.end()) {
    return Status::Ok();
  }
  return InvalidArgument(describe(tp) + ": decode rank " + std::to_string(tp.decode_tp_rank) +
                         " reads prefill ranks " + std::to_string(sources.front()) + ".." +
                         std::to_string(sources.back()) + ", not prefill rank " +
                         std::to_string(tp.prefill_tp_rank));
}

}  // namespace

Status validate_tp_pair(const TpPair& tp) {
  if (tp.prefill_tp_size == 0 || tp.decode_tp_size == 0) {
    return InvalidArgument(describe(tp) + ": TP sizes must be > 0");
  }
  if (tp.prefill_tp_rank >= tp.prefill_tp_size) {
    return InvalidArgument("prefill_tp_rank " + std::to_string(tp.prefill_tp_rank) +
                           " is not below prefill_tp_size " + std::to_string(tp.prefill_tp_size));
  }
  if (tp.decode_tp_rank >= tp.decode_tp_size) {
    return InvalidArgument("decode_tp_rank " + std::to_string(tp.decode_tp_rank) +
                           " is not below decode_tp_size " + std::to_string(tp.decode_tp_size));
  }
  const uint32_t hi = std::max(tp.prefill_tp_size, tp.decode_tp_size);
  const uint32_t lo = std::min(tp.prefill_tp_size, tp.decode_tp_size);
  if (hi % lo != 0) {
    return InvalidArgument(describe(tp) + ": the larger TP size must be a multiple of the smaller");
  }
  return Status::Ok();
}

Result<std::vector<uint32_t>> prefill_ranks_for_decode_rank(uint32_t prefill_tp_size,
                                                            uint32_t decode_tp_size,
                                                            uint32_t decode_tp_rank) {
  KVF_RETURN_IF_ERROR(validate_tp_pair(TpPair{prefill_tp_size, 0, decode_tp_size, decode_tp_rank}));
  if (prefill_tp_size <= decode_tp_size) {
    return std::vector<uint32_t>{decode_tp_rank / (decode_tp_size / prefill_tp_size)};
  }
  const uint32_t per_decode = prefill_tp_size / decode_tp_size;
  std::vector<uint32_t> ranks(per_decode);
  for (uint32_t i = 0; i < per_decode; ++i) ranks[i] = decode_tp_rank * per_decode + i;
  return ranks;
}

Result<HeadSlice> compute_head_slice(const TpPair& tp, uint32_t total_kv_heads) {
  KVF_RETURN_IF_ERROR(validate_tp_pair(tp));
  if (total_kv_heads == 0) return InvalidArgument("total_kv_heads must be > 0, got 0");
  KVF_RETURN_IF_ERROR(require_paired(tp));
  const uint32_t p = tp.prefill_tp_size;
  const uint32_t d = tp.decode_tp_size;
  HeadSlice slice;
  // max(1, H / TP): with more ranks than KV heads every rank holds one (replicated) head.
  slice.src_heads_per_rank = std::max(1u, total_kv_heads / p);
  slice.dst_heads_per_rank = std::max(1u, total_kv_heads / d);
  if (p > d) {
    // Gather: several prefill ranks fill one decode rank's heads; ranks that replicate the
    // same head (GQA, P > H) write the same place.
    const uint32_t src_replication = std::max(1u, p / total_kv_heads);
    const uint32_t unique_head = tp.prefill_tp_rank / src_replication;
    slice.src_head_start = 0;
    slice.num_heads = slice.src_heads_per_rank;
    slice.dst_head_start = (unique_head * slice.src_heads_per_rank) % slice.dst_heads_per_rank;
  } else {
    // Scatter: each decode rank takes its heads out of the prefill rank's; decode ranks that
    // replicate a head (D > H) share it by integer division.
    const uint32_t dst_replication = std::max(1u, d / total_kv_heads);
    const uint32_t unique_head = tp.decode_tp_rank / dst_replication;
    slice.src_head_start = (unique_head * slice.dst_heads_per_rank) % slice.src_heads_per_rank;
    slice.num_heads = slice.dst_heads_per_rank;
    slice.dst_head_start = 0;
  }
  return slice;
}

Result<DimSlice> compute_state_dim_slice(const TpPair& tp, uint64_t src_dim, uint64_t dst_dim) {
  KVF_RETURN_IF_ERROR(validate_tp_pair(tp));
  if (src_dim == 0 || dst_dim == 0) {
    return InvalidArgument("state dimensions must be > 0, got src_dim " + std::to_string(src_dim) +
                           " and dst_dim " + std::to_string(dst_dim));
  }
  KVF_RETURN_IF_ERROR(require_paired(tp));
  DimSlice slice;
  if (tp.prefill_tp_size > tp.decode_tp_size) {
    const uint32_t writers_per_decode = tp.prefill_tp_size / tp.decode_tp_size;
    slice.src_dim_start = 0;
    slice.num_dims = src_dim;
    slice.dst_dim_start = (tp.prefill_tp_rank % writers_per_decode) * src_dim;
  } else {
    slice.src_dim_start = (uint64_t{tp.decode_tp_rank} * dst_dim) % src_dim;
    slice.num_dims = dst_dim;
    slice.dst_dim_start = 0;
  }
  return slice;
}

}  // namespace kvferry::kv
