// build_transfer_plan and the checks and call scheduling every planner shares.
#include "kvferry/kv/planner.h"

#include <algorithm>
#include <string>

#include "kv/call_schedule.h"

namespace kvferry::kv {
namespace internal {

CallSchedule schedule_calls(std::span<const PageIndex> src_pages,
                            std::span<const PageIndex> dst_pages, const PlanOptions& options) {
  CallSchedule schedule;
  const size_t n = src_pages.size();
  const size_t limit =
      options.strategy == SendStrategy::kIndexSharded && options.max_pages_per_call > 0
          ? options.max_pages_per_call
          : std::max<size_t>(n, 1);
  schedule.slice_begin.reserve(n / limit + 2);
  schedule.slice_begin.push_back(0);
  for (size_t start = 0; start < n; start += limit) {
    const size_t count = std::min(limit, n - start);
    append_page_runs(src_pages.subspan(start, count), dst_pages.subspan(start, count),
                     schedule.runs);
    schedule.slice_begin.push_back(schedule.runs.size());
  }
  if (n == 0) schedule.slice_begin.push_back(0);
  return schedule;
}

Status validate_common(size_t src_entries, size_t dst_entries, size_t src_page_count,
                       size_t dst_page_count, const PlanOptions& options) {
  if (src_page_count != dst_page_count) {
    return InvalidArgument("page lists differ in length: src_pages has " +
                           std::to_string(src_page_count) + " pages, dst_pages has " +
                           std::to_string(dst_page_count));
  }
  if (src_entries != dst_entries) {
    return InvalidArgument("entry counts differ: source has " + std::to_string(src_entries) +
                           " entries, destination has " + std::to_string(dst_entries));
  }
  if (options.max_pages_per_call != 0 && options.strategy != SendStrategy::kIndexSharded) {
    return InvalidArgument("max_pages_per_call " + std::to_string(options.max_pages_per_call) +
                           " applies only to strategy index_sharded, not " +
                           std::string(send_strategy_name(options.strategy)));
  }
  return Status::Ok();
}

Status validate_pages_fit(const KvLayout& layout, std::span<const PageIndex> pages,
                          std::string_view side) {
  if (pages.empty()) return Status::Ok();
  const auto max_it = std::max_element(pages.begin(), pages.end());
  if (*max_it < layout.num_pages()) return Status::Ok();
  for (size_t e = 0; e < layout.num_entries(); ++e) {
    const KvEntry& entry = layout.entry(e);
    if (*max_it >= entry.num_pages()) {
      return OutOfRange(std::string(side) + " page " + std::to_string(*max_it) + " (position " +
                        std::to_string(max_it - pages.begin()) + ") is beyond entry " +
                        std::to_string(e) + ", whose " + std::to_string(entry.bytes) +
                        " bytes hold " + std::to_string(entry.num_pages()) + " pages of " +
                        std::to_string(entry.item_len) + " bytes");
    }
  }
  return Status::Ok();
}

}  // namespace internal

namespace {

Status validate_entry_pairs(const KvLayout& src, const KvLayout& dst) {
  for (size_t e = 0; e < src.num_entries(); ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    const std::string where = "entry " + std::to_string(e) + ": ";
    if (s.item_len != d.item_len) {
      return InvalidArgument(where + "source item_len " + std::to_string(s.item_len) +
                             " differs from destination item_len " + std::to_string(d.item_len));
    }
    if (s.role != d.role) {
      return InvalidArgument(where + "source role " + std::string(kv_role_name(s.role)) +
                             " differs from destination role " + std::string(kv_role_name(d.role)));
    }
    if (s.layer_id != d.layer_id) {
      return InvalidArgument(where + "source layer " + std::to_string(s.layer_id) +
                             " differs from destination layer " + std::to_string(d.layer_id));
    }
    if (s.draft != d.draft) {
      return InvalidArgument(where + "source is " + (s.draft ? "a draft" : "a target") +
                             " entry, destination is not");
    }
  }
  return Status::Ok();
}

bool is_contiguous(const KvEntry& e) { return e.page_stride == e.item_len; }

// Entry-major: for each entry, each run as one block (or one block per page when the entry's
// pages are not back to back).
void emit_entry_major(TransferPlan& plan, const KvLayout& src, const KvLayout& dst,
                      size_t first_entry, size_t end_entry, std::span<const PageRun> runs) {
  for (size_t e = first_entry; e < end_entry; ++e) {
    const KvEntry& s = src.entry(e);
    const KvEntry& d = dst.entry(e);
    const uint64_t item = s.item_len;
    if (is_contiguous(s) && is_contiguous(d)) {
      for (const PageRun& run : runs) {
        plan.add_block(s.base + run.src_first * item, d.base + run.dst_first * item,
                       item * run.length);
      }
      continue;
    }
    for (const PageRun& run : runs) {
      for (uint64_t k = 0; k < run.length; ++k) {
        plan.add_block(s.base + (run.src_first + k) * s.page_stride,
                       d.base + (run.dst_first + k) * d.page_stride, item);
      }
    }
  }
}

// Page-major: for each page of each run, every entry's slice of it, so that with coalescing
// a run of a page-major pool becomes one block for all layers.
void emit_page_major(TransferPlan& plan, const KvLayout& src, const KvLayout& dst,
                     size_t first_entry, size_t end_entry, std::span<const PageRun> runs) {
  for (const PageRun& run : runs) {
    for (uint64_t k = 0; k < run.length; ++k) {
      for (size_t e = first_entry; e < end_entry; ++e) {
        const KvEntry& s = src.entry(e);
        const KvEntry& d = dst.entry(e);
        plan.add_block(s.base + (run.src_first + k) * s.page_stride,
                       d.base + (run.dst_first + k) * d.page_stride, s.item_len);
      }
    }
  }
}

}  // namespace

Result<TransferPlan> build_transfer_plan(const KvLayout& src, const KvLayout& dst,
                                         std::span<const PageIndex> src_pages,
                                         std::span<const PageIndex> dst_pages,
                                         const PlanOptions& options) {
  KVF_RETURN_IF_ERROR(internal::validate_common(src.num_entries(), dst.num_entries(),
                                                src_pages.size(), dst_pages.size(), options));
  KVF_RETURN_IF_ERROR(validate_entry_pairs(src, dst));
  KVF_RETURN_IF_ERROR(internal::validate_pages_fit(src, src_pages, "src"));
  KVF_RETURN_IF_ERROR(internal::validate_pages_fit(dst, dst_pages, "dst"));

  const internal::CallSchedule schedule = internal::schedule_calls(src_pages, dst_pages, options);
  size_t max_blocks = 0;
  for (size_t e = 0; e < src.num_entries(); ++e) {
    max_blocks += is_contiguous(src.entry(e)) && is_contiguous(dst.entry(e)) ? schedule.runs.size()
                                                                             : src_pages.size();
  }
  TransferPlan plan(options.strategy, options.coalesce);
  plan.reserve(max_blocks, internal::count_calls(schedule, src.num_entries(), options.strategy));
  const bool page_major = src.info().page_order == PageOrder::kPageMajor &&
                          dst.info().page_order == PageOrder::kPageMajor;
  internal::emit_calls(plan, schedule, src.num_entries(), options.strategy,
                       [&](size_t first, size_t end, std::span<const PageRun> runs) {
                         if (page_major && end - first > 1) {
                           emit_page_major(plan, src, dst, first, end, runs);
                         } else {
                           emit_entry_major(plan, src, dst, first, end, runs);
                         }
                       });
  plan.finish();
  return plan;
}

}  // namespace kvferry::kv
