#include "pd/page_pattern.h"

#include <algorithm>
#include <vector>

#include "core/pattern.h"

namespace kvferry::pd {
namespace {

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a * 0x9E3779B97F4A7C15ull ^ (b + 0x632BE59BD9B4E019ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  return x * 0xBF58476D1CE4E5B9ull;
}

uint64_t entry_seed(uint64_t room, const kv::KvEntry& e) {
  return mix(mix(room, e.layer_id), (static_cast<uint64_t>(e.role) << 1) | (e.draft ? 1 : 0));
}

// Calls fn(slot, stream_offset, length) for every token slot of the request in `entry`.
template <typename Fn>
void for_each_token(const kv::KvLayout& layout, const kv::KvEntry& e, kv::PageIndex page,
                    uint64_t page_index, uint64_t num_tokens, HeadRange heads, Fn&& fn) {
  const uint64_t page_tokens = layout.info().page_size_tokens;
  const uint64_t token_bytes = e.item_len / page_tokens;
  const uint64_t first = page_index * page_tokens;
  const uint64_t last = std::min(num_tokens, first + page_tokens);
  auto* base = reinterpret_cast<std::byte*>(e.base + page * e.page_stride);
  const bool sliced =
      heads.total_kv_heads != 0 && (e.role == kv::KvRole::kKey || e.role == kv::KvRole::kValue);
  if (!sliced) {  // the page's tokens are one contiguous piece of the stream
    fn(base, first * token_bytes, (last - first) * token_bytes);
    return;
  }
  const uint32_t local_heads = std::max<uint32_t>(1, layout.info().kv_heads);
  const uint64_t head_bytes = token_bytes / local_heads;
  for (uint64_t t = first; t < last; ++t) {
    fn(base + (t - first) * token_bytes, (t * heads.total_kv_heads + heads.head_start) * head_bytes,
       token_bytes);
  }
}

}  // namespace

HeadRange head_range_for_rank(uint32_t total_kv_heads, uint32_t tp_size, uint32_t rank) {
  if (total_kv_heads == 0 || tp_size == 0) return {};
  if (tp_size <= total_kv_heads) return {total_kv_heads, rank * (total_kv_heads / tp_size)};
  return {total_kv_heads, rank / (tp_size / total_kv_heads)};
}

void fill_request_pages(const kv::KvLayout& layout, std::span<const kv::PageIndex> pages,
                        uint64_t num_tokens, uint64_t room, HeadRange heads) {
  for (const kv::KvEntry& e : layout.entries()) {
    const uint64_t seed = entry_seed(room, e);
    for (size_t i = 0; i < pages.size(); ++i) {
      for_each_token(layout, e, pages[i], i, num_tokens, heads,
                     [&](std::byte* slot, uint64_t offset, uint64_t len) {
                       fill_pattern({slot, len}, seed, offset);
                     });
    }
  }
}

uint64_t count_corrupt_pages(const kv::KvLayout& layout, std::span<const kv::PageIndex> pages,
                             uint64_t num_tokens, uint64_t room, HeadRange heads) {
  std::vector<bool> corrupt(pages.size(), false);
  for (const kv::KvEntry& e : layout.entries()) {
    const uint64_t seed = entry_seed(room, e);
    for (size_t i = 0; i < pages.size(); ++i) {
      if (corrupt[i]) continue;
      for_each_token(layout, e, pages[i], i, num_tokens, heads,
                     [&](std::byte* slot, uint64_t offset, uint64_t len) {
                       if (!corrupt[i] && find_pattern_mismatch({slot, len}, seed, offset)) {
                         corrupt[i] = true;
                       }
                     });
    }
  }
  return static_cast<uint64_t>(std::count(corrupt.begin(), corrupt.end(), true));
}

void fill_rows(std::span<const kv::RowBuffer> buffers, uint64_t row, uint64_t room) {
  for (size_t b = 0; b < buffers.size(); ++b) {
    auto* p = reinterpret_cast<std::byte*>(buffers[b].base + row * buffers[b].row_bytes);
    fill_pattern({p, buffers[b].row_bytes}, mix(room, 1000 + b), 0);
  }
}

uint64_t count_corrupt_rows(std::span<const kv::RowBuffer> buffers, uint64_t row, uint64_t room) {
  uint64_t bad = 0;
  for (size_t b = 0; b < buffers.size(); ++b) {
    auto* p = reinterpret_cast<const std::byte*>(buffers[b].base + row * buffers[b].row_bytes);
    if (find_pattern_mismatch({p, buffers[b].row_bytes}, mix(room, 1000 + b), 0)) ++bad;
  }
  return bad;
}

}  // namespace kvferry::pd
