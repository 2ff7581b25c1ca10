// Verifiable KV pages for demos and tests: the bytes of token t of layer entry e of request
// `room` are a slice of one deterministic stream per (room, entry), so the decode side checks
// what it received without being sent the expected copy, whatever its TP rank holds.
//
// Stream layout per (room, entry): token t's full slot over all heads at offset
// t * total_heads * head_bytes; a rank holding heads [head_start, +heads) holds the slice
// starting at head_start * head_bytes. Replicated entries (MLA, state) use the whole slot:
// offset t * token_bytes. Aux rows and state slots: one stream per (room, buffer).
//
// Thread-safety: pure functions over memory the caller owns.
#pragma once

#include <cstdint>
#include <span>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/slot_plan.h"

namespace kvferry::pd {

// Which heads a rank holds (all of them for replicated layouts: total_kv_heads 0).
struct HeadRange {
  uint32_t total_kv_heads = 0;
  uint32_t head_start = 0;
};

// The first global head of `rank` of `tp_size` with `total_kv_heads` heads (GQA replication
// when tp_size > heads).
HeadRange head_range_for_rank(uint32_t total_kv_heads, uint32_t tp_size, uint32_t rank);

// Fills tokens [0, num_tokens) of the request whose prompt pages (in order) are `pages`.
void fill_request_pages(const kv::KvLayout& layout, std::span<const kv::PageIndex> pages,
                        uint64_t num_tokens, uint64_t room, HeadRange heads);
// Counts the pages (over all entries: a page is corrupt if any entry's slice of it is) that
// differ from what fill_request_pages would have written.
uint64_t count_corrupt_pages(const kv::KvLayout& layout, std::span<const kv::PageIndex> pages,
                             uint64_t num_tokens, uint64_t room, HeadRange heads);

// Aux rows / state slots: one stream per (room, buffer index), the whole row.
void fill_rows(std::span<const kv::RowBuffer> buffers, uint64_t row, uint64_t room);
// Number of buffers whose row differs.
uint64_t count_corrupt_rows(std::span<const kv::RowBuffer> buffers, uint64_t row, uint64_t room);

}  // namespace kvferry::pd
