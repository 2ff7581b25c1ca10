// Helpers shared by the kv planner tests: host buffers that back layouts, applying a plan to
// them byte by byte, and reading blocks back as tuples.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/transfer_plan.h"

namespace kvferry::kv::testing {

using Block = std::tuple<uint64_t, uint64_t, uint64_t>;

inline std::vector<Block> blocks_of(const TransferPlan& plan, size_t call) {
  std::vector<Block> out;
  const PlanCall c = plan.call(call);
  for (size_t i = 0; i < c.num_blocks(); ++i) out.emplace_back(c.src[i], c.dst[i], c.len[i]);
  return out;
}

inline std::vector<uint64_t> call_field(std::span<const uint64_t> values) {
  return std::vector<uint64_t>(values.begin(), values.end());
}

// A host buffer whose address stands in for registered memory.
struct HostBuffer {
  explicit HostBuffer(size_t bytes) : data(bytes) {}
  uint64_t base() const { return reinterpret_cast<uint64_t>(data.data()); }
  bool contains(uint64_t addr, uint64_t len) const {
    return addr >= base() && len <= data.size() && addr - base() <= data.size() - len;
  }
  void fill_random(uint32_t seed) {
    std::mt19937 rng(seed);
    for (auto& b : data) b = static_cast<uint8_t>(rng() | 1u);  // never zero
  }
  std::vector<uint8_t> data;
};

// Copies every block of `plan` from `src` to `dst`; fails the test on any block outside them.
inline void apply_plan(const TransferPlan& plan, const HostBuffer& src, HostBuffer& dst) {
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    const PlanCall call = plan.call(c);
    for (size_t b = 0; b < call.num_blocks(); ++b) {
      ASSERT_TRUE(src.contains(call.src[b], call.len[b])) << "src block " << b << " of call " << c;
      ASSERT_TRUE(dst.contains(call.dst[b], call.len[b])) << "dst block " << b << " of call " << c;
      std::memcpy(reinterpret_cast<void*>(call.dst[b]), reinterpret_cast<const void*>(call.src[b]),
                  call.len[b]);
    }
  }
}

}  // namespace kvferry::kv::testing
