// SpanRecycler: span storage handed from finished batches to new ones.
//
// A batch gets a span per op that does not merge with the one before (56 bytes each). Fresh
// storage for a million of them is 14,000 newly touched pages, each a page fault (several
// microseconds on a virtual machine), and glibc returns storage that large to the kernel when
// the batch ends, so every such batch would pay them again (10x per op at a million unmerged
// ops what a thousand cost). Finished batches give their storage back here and the next large
// batch takes it, already faulted in.
//
// Only large storage is kept (batches of fewer ops take no lock), and what is kept is bounded
// in count and bytes, the largest kept first: an engine that once ran a huge batch keeps at
// most kMaxKeptBytes (a million unmerged spans) for later ones.
//
// Thread-safety: take and give may be called from any thread.
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/op_resolver.h"

namespace kvferry::detail {

class SpanRecycler {
 public:
  // Batches of fewer ops allocate their own (a few pages at most).
  static constexpr size_t kMinSpans = 1024;
  static constexpr size_t kMaxKept = 8;
  static constexpr size_t kMaxKeptBytes = size_t{64} << 20;

  // Empty storage for at least `spans` spans: kept storage when some is large enough (the
  // smallest such), else new.
  ResolvedSpans take(size_t spans);
  // Keeps `storage` for a later take when it is large; over a bound, the smallest kept go.
  void give(ResolvedSpans storage);

  size_t kept_bytes() const;

 private:
  static size_t bytes_of(const ResolvedSpans& s) { return s.capacity() * sizeof(ResolvedOp); }

  mutable std::mutex mu_;
  std::vector<ResolvedSpans> kept_;  // guarded by mu_
  size_t kept_bytes_ = 0;            // guarded by mu_
};

}  // namespace kvferry::detail
