// The transfer planner: turns a request's prefill pages and decode pages into a TransferPlan.
//
//  * build_transfer_plan: same-TP (or replicated MLA) transfer. Pages are grouped into runs
//    (group_page_runs); each run becomes one block per entry (per page per entry for a
//    page-major pool, interleaved so coalescing yields one block per run for all layers).
//  * build_head_sliced_plan: MHA/GQA with prefill TP != decode TP. One block per token per
//    entry, carrying the head slice of compute_head_slice, before coalescing.
//
// Strategies (PlanOptions::strategy) decide how blocks are cut into calls: kAllLayers one
// call with entries in order; kPerLayer one call per entry; kIndexSharded one call per slice
// of max_pages_per_call pages (each slice grouped on its own so no block crosses a slice; a
// single call when max_pages_per_call is 0 or not below the page count).
//
// Thread-safety: pure functions; layouts and page lists are only read.
#pragma once

#include <cstdint>
#include <span>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/send_strategy.h"
#include "kvferry/kv/tp_slice.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/status.h"

namespace kvferry::kv {

struct PlanOptions {
  SendStrategy strategy = SendStrategy::kAllLayers;
  // Pages per call for kIndexSharded; 0 = no limit. Must be 0 for the other strategies (a
  // limit they would ignore is an error, not a silent fallback).
  uint32_t max_pages_per_call = 0;
  // Merge consecutive blocks of one call that are contiguous on both sides.
  bool coalesce = true;
};

// Errors, each naming the value:
//  InvalidArgument: page lists of different lengths; different entry counts; an entry pair
//    whose item_len, role, layer id or draft flag differ; max_pages_per_call set for a
//    strategy other than kIndexSharded.
//  OutOfRange: a page index beyond what an entry's bytes hold.
Result<TransferPlan> build_transfer_plan(const KvLayout& src, const KvLayout& dst,
                                         std::span<const PageIndex> src_pages,
                                         std::span<const PageIndex> dst_pages,
                                         const PlanOptions& options = {});

// Head-sliced plan for prefill TP != decode TP (works for equal TP too: one full-slot block
// per token, coalesced back into runs). Every entry must be K or V. The per-head byte size
// comes from the source token slot (item_len / page_size / src heads per rank).
// Errors, beyond build_transfer_plan's (item lengths may differ here):
//  InvalidArgument: a bad TP pair or head count (see compute_head_slice); page sizes differ;
//    an entry that is not K or V (MLA is replicated: use build_transfer_plan); an item_len
//    not divisible into tokens and heads; a layout whose kv_heads disagrees with the TP
//    split; a head slice larger than the destination token slot.
//  OutOfRange: a slice that runs past the end of either token slot.
Result<TransferPlan> build_head_sliced_plan(const KvLayout& src, const KvLayout& dst,
                                            std::span<const PageIndex> src_pages,
                                            std::span<const PageIndex> dst_pages, const TpPair& tp,
                                            uint32_t total_kv_heads,
                                            const PlanOptions& options = {});

}  // namespace kvferry::kv
