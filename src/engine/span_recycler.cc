#include "engine/span_recycler.h"

#include <algorithm>
#include <utility>

namespace kvferry::detail {

ResolvedSpans SpanRecycler::take(size_t spans) {
  {
    std::lock_guard lock(mu_);
    size_t best = kept_.size();
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i].capacity() < spans) continue;
      if (best == kept_.size() || kept_[i].capacity() < kept_[best].capacity()) best = i;
    }
    if (best != kept_.size()) {
      ResolvedSpans found = std::move(kept_[best]);
      std::swap(kept_[best], kept_.back());
      kept_.pop_back();
      kept_bytes_ -= bytes_of(found);
      return found;
    }
  }
  ResolvedSpans fresh;
  fresh.reserve(spans);
  return fresh;
}

void SpanRecycler::give(ResolvedSpans storage) {
  if (storage.capacity() < kMinSpans || bytes_of(storage) > kMaxKeptBytes) return;
  storage.clear();
  std::vector<ResolvedSpans> dropped;  // freed after the lock
  std::lock_guard lock(mu_);
  kept_bytes_ += bytes_of(storage);
  kept_.push_back(std::move(storage));
  // Over a bound, the smallest go: a large one serves every batch a small one would.
  while (kept_.size() > kMaxKept || kept_bytes_ > kMaxKeptBytes) {
    auto smallest = std::min_element(kept_.begin(), kept_.end(), [](const auto& a, const auto& b) {
      return a.capacity() < b.capacity();
    });
    kept_bytes_ -= bytes_of(*smallest);
    std::swap(*smallest, kept_.back());
    dropped.push_back(std::move(kept_.back()));
    kept_.pop_back();
  }
}

size_t SpanRecycler::kept_bytes() const {
  std::lock_guard lock(mu_);
  return kept_bytes_;
}

}  // namespace kvferry::detail
