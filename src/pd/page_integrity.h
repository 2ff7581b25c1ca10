// Opt-in end-to-end integrity of host-memory KV pages (PdIntegrity, docs/PROTOCOL.md).
//
// What one prefill rank wrote to a destination page is the page's footprint: the byte
// ranges (entry, offset into the page, length) its plans covered, sorted by (entry, offset)
// and merged where adjacent. The planners cut every page of a request alike (full pages, or
// the same head slice of every token of every page under TP head slicing), so one footprint
// describes all pages and travels once per request; a page whose footprint differs is an
// Internal error on the sender. The digest of a page is XXH3-64 over its footprint's bytes
// in footprint order. It is independent of the send strategy and of coalescing, and decode
// recomputes it from its own layout and the footprint alone.
//
// The sender hashes its source bytes (what it meant to write), decode the bytes that
// landed; both read memory on the CPU, so device memory is refused at create().
//
// Thread-safety: PageDigester is used by one thread at a time (the sender holds the
// request's lock); verify_pages is a pure function over memory it only reads.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvferry/kv/kv_layout.h"
#include "kvferry/kv/transfer_plan.h"
#include "kvferry/pd/control_message.h"
#include "kvferry/status.h"

namespace kvferry::pd::detail {

// Accumulates the digests of the pages one prefill rank writes to one decode rank for one
// request, chunk by chunk.
class PageDigester {
 public:
  // Hashes the source bytes of every block of `plan` (a KV chunk plan into `dst`, whose
  // source is CPU-readable host memory). Errors: Internal naming the page whose footprint
  // differs from the request's first page, or a block outside every page of `dst`.
  Status add_chunk(const kv::TransferPlan& plan, const kv::KvLayout& dst);
  // The footprint and one digest per page seen so far (sorted by page).
  PageIntegrity result() const;

 private:
  // Set by the first page digested (a plain vector and a flag, not std::optional: gcc 12
  // under ASan reports the optional's vector as maybe-uninitialized when it is moved).
  std::vector<PageRange> footprint_;
  bool has_footprint_ = false;
  std::map<kv::PageIndex, uint64_t> digests_;
};

// Checks that `integrity` covers exactly `pages` and that every page's bytes in `layout`
// hash to the digest sent. `who` names the sender in messages. Errors: ProtocolError
// (footprint outside the layout, pages that do not match the request), DataCorrupted naming
// the first page whose bytes differ.
Status verify_pages(const PageIntegrity& integrity, const kv::KvLayout& layout,
                    std::span<const kv::PageIndex> pages, const std::string& who);

}  // namespace kvferry::pd::detail
