#include "kvferry/kv/page_runs.h"

#include <string>

namespace kvferry::kv {

void append_page_runs(std::span<const PageIndex> src_pages, std::span<const PageIndex> dst_pages,
                      std::vector<PageRun>& out) {
  const size_t n = src_pages.size();
  size_t i = 0;
  while (i < n) {
    size_t j = i + 1;
    // Compared in 64 bits so the largest page index followed by 0 is a cut, not a step.
    while (j < n && uint64_t{src_pages[j]} == uint64_t{src_pages[j - 1]} + 1 &&
           uint64_t{dst_pages[j]} == uint64_t{dst_pages[j - 1]} + 1) {
      ++j;
    }
    out.push_back(PageRun{src_pages[i], dst_pages[i], static_cast<uint32_t>(j - i)});
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
