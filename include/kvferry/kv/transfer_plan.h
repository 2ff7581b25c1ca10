// TransferPlan: the engine calls that move one request's KV (or its state, or its aux row),
// in execution order, each a list of blocks (src address, dst address, length).
//
// Storage is a flat structure of arrays for the whole plan: three uint64 arrays indexed by
// block and one offset per call. Building a plan allocates O(1) times, never per block;
// memory_bytes() reports what the plan holds (24 bytes per block plus one offset per call,
// and the slack of an over-reserved array, trimmed once it exceeds a quarter).
//
// Coalescing: when enabled, a block that continues the previous block of the same call on
// both sides (src and dst contiguous) extends it instead of being appended. Blocks never
// merge across calls.
//
// Ownership: a value that owns its arrays. Views returned by call() borrow from the plan and
// die with it or with the next mutation.
// Thread-safety: const methods may run concurrently; building needs exclusive access.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvferry/kv/send_strategy.h"

namespace kvferry::kv {

// One engine call: parallel arrays, block i = (src[i], dst[i], len[i]).
struct PlanCall {
  std::span<const uint64_t> src;
  std::span<const uint64_t> dst;
  std::span<const uint64_t> len;

  size_t num_blocks() const { return src.size(); }
  uint64_t bytes() const;
};

class TransferPlan {
 public:
  TransferPlan() = default;
  TransferPlan(SendStrategy strategy, bool coalesce) : strategy_(strategy), coalesce_(coalesce) {}

  SendStrategy strategy() const { return strategy_; }
  bool coalesce() const { return coalesce_; }
  size_t num_calls() const { return call_begin_.size(); }
  size_t num_blocks() const { return src_.size(); }
  bool empty() const { return src_.empty(); }
  PlanCall call(size_t i) const;
  // Sum of every block's length.
  uint64_t total_bytes() const;
  // Bytes this plan holds, its own object included.
  size_t memory_bytes() const;

  // --- Building. The planner uses these; so may tests and tools that need a handmade plan.
  // Reserves room for `blocks` blocks and `calls` calls (upper bounds are fine: finish()
  // trims large slack).
  void reserve(size_t blocks, size_t calls);
  // Starts a new call; later blocks belong to it. A call left empty stays in the plan.
  void start_call() { call_begin_.push_back(src_.size()); }
  // Appends (or, when coalescing, merges) one block into the current call.
  // Precondition: start_call() was called; len > 0.
  void add_block(uint64_t src, uint64_t dst, uint64_t len) {
    const size_t n = src_.size();
    if (coalesce_ && n > call_begin_.back()) {
      const uint64_t last_len = len_[n - 1];
      if (src_[n - 1] + last_len == src && dst_[n - 1] + last_len == dst) {
        len_[n - 1] = last_len + len;
        return;
      }
    }
    src_.push_back(src);
    dst_.push_back(dst);
    len_.push_back(len);
  }
  // Trims reserved-but-unused memory when it exceeds a quarter of what is used.
  void finish();

 private:
  SendStrategy strategy_ = SendStrategy::kAllLayers;
  bool coalesce_ = true;
  std::vector<uint64_t> src_;
  std::vector<uint64_t> dst_;
  std::vector<uint64_t> len_;
  std::vector<size_t> call_begin_;  // first block of each call
};

}  // namespace kvferry::kv
