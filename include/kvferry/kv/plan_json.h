// The JSON form of a plan request and of a plan, used by `kvferry plan` (and by anything
// else that wants plans at a text edge). Field reference: docs/PLAN_FORMAT.md.
//
// Request: {"src_ptrs": [..], "dst_ptrs": [..], "item_lens": [..], "src_pages": [..],
//           "dst_pages": [..], "strategy": "all_layers", "max_pages_per_call": 0,
//           "coalesce": true, ...optional fields}
// Plan:    {"calls": [{"blocks": [[src, dst, len], ...]}, ...]}
//
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/planner.h"
#include "kvferry/kv/tp_slice.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/status.h"

namespace kvferry::kv {

struct HeadSliceRequest {
  TpPair tp;
  uint32_t total_kv_heads = 0;
  uint32_t page_size_tokens = 0;
};

// A parsed request. Layouts are built from the pointer lists: entry i is
// (src_ptrs[i], item_lens[i]) -> (dst_ptrs[i], dst_item_lens[i]).
struct PlanRequest {
  KvLayout src_layout;
  KvLayout dst_layout;
  std::vector<PageIndex> src_pages;
  std::vector<PageIndex> dst_pages;
  PlanOptions options;
  std::optional<HeadSliceRequest> head_slice;
};

// Parses and validates a request. Every error is InvalidArgument naming the field and the
// value ("field 'strategy': unknown send strategy 'fast' (valid: ...)").
Result<PlanRequest> parse_plan_request(std::string_view json_text);

// Builds the plan a request asks for (build_transfer_plan or build_head_sliced_plan).
Result<TransferPlan> build_requested_plan(const PlanRequest& request);

// {"calls": [{"blocks": [[src, dst, len], ...]}, ...]}, calls in execution order.
std::string plan_to_json(const TransferPlan& plan);

}  // namespace kvferry::kv
