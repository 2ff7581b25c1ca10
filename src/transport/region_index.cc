#include "transport/region_index.h"

#include <algorithm>

namespace kvferry {

const RegionEntry* RegionIndex::find_slow(uint64_t addr, uint64_t length, size_t& hint) const {
  // First region with addr > target, then step back one.
  auto it = std::upper_bound(entries_.begin(), entries_.end(), addr,
                             [](uint64_t a, const RegionEntry& r) { return a < r.addr; });
  if (it == entries_.begin()) return nullptr;
  --it;
  if (!contains(*it, addr, length)) return nullptr;
  hint = static_cast<size_t>(it - entries_.begin());
  return &*it;
}

const RegionEntry* RegionIndex::find_overlap(uint64_t addr, uint64_t length) const {
  uint64_t end = addr + length;
  auto it = std::upper_bound(entries_.begin(), entries_.end(), addr,
                             [](uint64_t a, const RegionEntry& r) { return a < r.addr; });
  if (it != entries_.begin() && std::prev(it)->end() > addr) return &*std::prev(it);
  if (it != entries_.end() && it->addr < end) return &*it;
  return nullptr;
}

const RegionEntry* RegionIndex::find_start(uint64_t addr) const {
  auto it = std::lower_bound(entries_.begin(), entries_.end(), addr,
                             [](const RegionEntry& r, uint64_t a) { return r.addr < a; });
  return it != entries_.end() && it->addr == addr ? &*it : nullptr;
}

}  // namespace kvferry
