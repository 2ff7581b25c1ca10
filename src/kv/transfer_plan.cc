#include "kvferry/kv/transfer_plan.h"

namespace kvferry::kv {

uint64_t PlanCall::bytes() const {
  uint64_t total = 0;
  for (uint64_t l : len) total += l;
  return total;
}

PlanCall TransferPlan::call(size_t i) const {
  const size_t begin = call_begin_[i];
  const size_t end = i + 1 < call_begin_.size() ? call_begin_[i + 1] : src_.size();
  const size_t n = end - begin;
  return PlanCall{std::span<const uint64_t>(src_).subspan(begin, n),
                  std::span<const uint64_t>(dst_).subspan(begin, n),
                  std::span<const uint64_t>(len_).subspan(begin, n)};
}

uint64_t TransferPlan::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t l : len_) total += l;
  return total;
}

size_t TransferPlan::memory_bytes() const {
  return sizeof(*this) + (src_.capacity() + dst_.capacity() + len_.capacity()) * sizeof(uint64_t) +
         call_begin_.capacity() * sizeof(size_t);
}

void TransferPlan::reserve(size_t blocks, size_t calls) {
  src_.reserve(blocks);
  dst_.reserve(blocks);
  len_.reserve(blocks);
  call_begin_.reserve(calls);
}

void TransferPlan::finish() {
  const size_t used = src_.size();
  if (src_.capacity() - used > used / 4) {
    src_.shrink_to_fit();
    dst_.shrink_to_fit();
    len_.shrink_to_fit();
  }
  if (call_begin_.capacity() - call_begin_.size() > call_begin_.size() / 4) {
    call_begin_.shrink_to_fit();
  }
}

}  // namespace kvferry::kv
