// Plans for the per-request extras that go with a request's last chunk: Mamba state slots
// (resliced when prefill and decode TP differ) and aux rows (first output token ids, ...).
// Page-list state (sliding window, NSA) is not here: it is a KvLayout of kState entries
// planned with build_transfer_plan like any paged buffer.
//
// Both plans are one call (kAllLayers) with one block per buffer, in buffer order.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "kvferry/kv/tp_slice.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/status.h"

namespace kvferry::kv {

// A buffer of fixed-size rows: one aux field for every request slot, or one Mamba state
// tensor for every state slot. Row r is [base + r * row_bytes, + row_bytes).
struct RowBuffer {
  uint64_t base = 0;
  uint64_t bytes = 0;
  uint64_t row_bytes = 0;
};

// A Mamba state tensor: rows are state slots; tp_dim is the size of its TP-sharded
// dimension on this rank (conv_dim / tp or num_heads / tp). row_bytes must be a multiple of
// tp_dim (everything after that dimension is contiguous per entry of it).
struct MambaStateTensor {
  RowBuffer rows;
  uint64_t tp_dim = 0;
};

// One block per aux buffer: row src_row of src[i] to row dst_row of dst[i].
// Errors: InvalidArgument (buffer counts differ, zero row_bytes, row sizes differ),
// OutOfRange (a row beyond a buffer's bytes). Each names the buffer and the value.
Result<TransferPlan> build_aux_plan(std::span<const RowBuffer> src, std::span<const RowBuffer> dst,
                                    uint64_t src_row, uint64_t dst_row);

// One block per state tensor. With equal TP the whole slot (row sizes must match); otherwise
// the slice of compute_state_dim_slice, bytes per dimension entry taken from each side.
// Errors: InvalidArgument (counts differ, zero sizes, bad TP pair, row_bytes not a multiple
// of tp_dim, a slice larger than the destination slot), OutOfRange (a slot beyond a buffer).
Result<TransferPlan> build_mamba_state_plan(std::span<const MambaStateTensor> src,
                                            std::span<const MambaStateTensor> dst,
                                            uint64_t src_slot, uint64_t dst_slot, const TpPair& tp);

}  // namespace kvferry::kv
