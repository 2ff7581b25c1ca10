// Page-run grouping: the step that turns two page lists into as few blocks as possible.
//
// The prefill page list and the decode page list (equal length) are cut wherever the two
// sides do not both step by +1, or both by -1. Each resulting run copies `length`
// consecutive pages from src_first.. to dst_first.. and becomes one block per entry (for
// layer-major pools); a run that both sides walk downwards is the same pages from its last
// one up. Page lists walk downwards where an allocator hands out pages it took back last
// first: vLLM frees a request's blocks in reverse order, and its free queue gives them out
// in that order. Examples: src [1,2,5], dst [11,12,15] -> runs {1, 11, 2} and {5, 15, 1};
// src [9,8,7], dst [23,22,21] -> run {7, 21, 3}; src [9,8], dst [21,22] -> {9, 21, 1} and
// {8, 22, 1}.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/status.h"

namespace kvferry::kv {

struct PageRun {
  PageIndex src_first = 0;
  PageIndex dst_first = 0;
  uint32_t length = 0;  // pages, >= 1

  friend bool operator==(const PageRun&, const PageRun&) = default;
};

// Groups the two lists. Error: InvalidArgument when their lengths differ (naming both).
Result<std::vector<PageRun>> group_page_runs(std::span<const PageIndex> src_pages,
                                             std::span<const PageIndex> dst_pages);

// Appends the runs of two equal-length lists to `out` without validating; the planner uses it
// to group each index slice on its own without a fresh allocation. Precondition:
// src_pages.size() == dst_pages.size().
void append_page_runs(std::span<const PageIndex> src_pages, std::span<const PageIndex> dst_pages,
                      std::vector<PageRun>& out);

}  // namespace kvferry::kv
