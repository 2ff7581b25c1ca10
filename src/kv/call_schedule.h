// Internal to the planner: how a strategy cuts pages into calls, shared by the plain and the
// head-sliced planners so both follow the same rules.
#pragma once

#include <cstddef>
#include <span>
#include <string_view>
#include <vector>

#include "kvferry/kv/page_runs.h"
#include "kvferry/kv/planner.h"
#include "kvferry/kv/transfer_plan.h"

namespace kvferry::kv::internal {

// The page runs of a request, grouped per index slice (one slice unless index-sharded with a
// limit below the page count). Slice s covers runs [slice_begin[s], slice_begin[s + 1]).
struct CallSchedule {
  std::vector<PageRun> runs;
  std::vector<size_t> slice_begin;  // num_slices + 1 offsets into runs

  size_t num_slices() const { return slice_begin.size() - 1; }
  std::span<const PageRun> slice(size_t s) const {
    return std::span<const PageRun>(runs).subspan(slice_begin[s],
                                                  slice_begin[s + 1] - slice_begin[s]);
  }
};

// Precondition: equal lengths (validated by the caller).
CallSchedule schedule_calls(std::span<const PageIndex> src_pages,
                            std::span<const PageIndex> dst_pages, const PlanOptions& options);

// Checks what every planner checks: equal page-list lengths, equal entry counts, a
// max_pages_per_call only with kIndexSharded.
Status validate_common(size_t src_entries, size_t dst_entries, size_t src_page_count,
                       size_t dst_page_count, const PlanOptions& options);

// Checks that every page of `pages` lies inside every entry of `layout`; `side` is "src" or
// "dst" for the message.
Status validate_pages_fit(const KvLayout& layout, std::span<const PageIndex> pages,
                          std::string_view side);

// Drives the strategy: calls emit(first_entry, end_entry, runs) once per call, after
// starting the call on `plan`.
template <typename EmitCall>
void emit_calls(TransferPlan& plan, const CallSchedule& schedule, size_t num_entries,
                SendStrategy strategy, EmitCall&& emit) {
  if (schedule.runs.empty()) return;
  if (strategy == SendStrategy::kPerLayer) {
    for (size_t e = 0; e < num_entries; ++e) {
      plan.start_call();
      emit(e, e + 1, schedule.slice(0));
    }
    return;
  }
  for (size_t s = 0; s < schedule.num_slices(); ++s) {
    plan.start_call();
    emit(size_t{0}, num_entries, schedule.slice(s));
  }
}

// Calls the plan will hold for this schedule and strategy.
inline size_t count_calls(const CallSchedule& schedule, size_t num_entries, SendStrategy strategy) {
  if (schedule.runs.empty()) return 0;
  return strategy == SendStrategy::kPerLayer ? num_entries : schedule.num_slices();
}

}  // namespace kvferry::kv::internal
