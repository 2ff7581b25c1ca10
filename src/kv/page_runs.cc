#include "kvferry/kv/page_runs.h"

#include <string>

namespace kvferry::kv {

void append_page_runs(std::span<const PageIndex> src_pages, std::span<const PageIndex> dst_pages,
                      std::vector<PageRun>& out) {
  const size_t n = src_pages.size();
  // Whether both sides step by `by` from k - 1 to k. Signed 64 bits, so the largest page
  // index followed by 0 (or 0 by the largest) is a cut, not a step.
  auto steps = [&](size_t k, int64_t by) {
    return int64_t{src_pages[k]} == int64_t{src_pages[k - 1]} + by &&
           int64_t{dst_pages[k]} == int64_t{dst_pages[k - 1]} + by;
  };
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    const int64_t by = j < n && steps(j, -1) ? -1 : 1;
    while (j < n && steps(j, by)) ++j;
    const size_t lowest = by < 0 ? j - 1 : i;  // a run walked downwards starts at its end
    out.push_back(PageRun{src_pages[lowest], dst_pages[lowest], static_cast<uint32_t>(j - i)});
    i = j;
  }
}

Result<std::vector<PageRun>> group_page_runs(std::span<const PageIndex> src_pages,
                                             std::span<const PageIndex> dst_pages) {
  if (src_pages.size() != dst_pages.size()) {
    return InvalidArgument("page lists differ in length: src_pages has " +
                           std::to_string(src_pages.size()) + " pages, dst_pages has " +
                           std::to_string(dst_pages.size()));
  }
  std::vector<PageRun> runs;
  append_page_runs(src_pages, dst_pages, runs);
  return runs;
}

}  // namespace kvferry::kv
