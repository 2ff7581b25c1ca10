// KvLayout: what one rank has registered for its KV cache, as the planner sees it.
//
// A layout is a list of entries (one registered buffer of pages each: a layer's K, a layer's
// V, an MLA layer's latent cache, a paged state buffer) plus the model facts the entries
// were built from. Page p of entry e starts at `base + p * page_stride` and `item_len` bytes
// of it are copied. For the usual layer-major pools page_stride == item_len; in a page-major
// pool (all layers of one page contiguous) each entry's pages are page_stride apart and
// several entries share one page.
//
// Entry order is the wire order: MHA/GQA is all K layers then all V layers, MLA is one entry
// per layer, and draft-model (speculative decoding) entries follow the target's.
//
// Ownership: a KvLayout is a value; it describes memory but owns none of it.
// Thread-safety: immutable after construction; share freely between threads.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kvferry/status.h"

namespace kvferry::kv {

// Index of a page inside a KV pool.
using PageIndex = uint32_t;

// Bounds on what a layout may describe. A layout allocates per entry (never per page or per
// byte) and does its byte arithmetic in 64 bits, so a wrong value (a negative number read as
// unsigned, a byte count passed as a page count) is an InvalidArgument naming it instead of
// an allocation of its size or an overflow. Each is far beyond any model's.
inline constexpr uint64_t kMaxLayoutEntries = uint64_t{1} << 20;  // entries of one layout
inline constexpr uint32_t kMaxLayers = 1u << 16;                  // layers of an MHA/MLA shape
inline constexpr uint32_t kMaxPageSizeTokens = 1u << 20;          // tokens of one page
inline constexpr uint64_t kMaxShapePages = uint64_t{1} << 32;     // pages of a shape (PageIndex)
inline constexpr uint64_t kMaxItemBytes = uint64_t{1} << 40;      // one page of one entry

enum class KvRole : uint8_t {
  kKey = 0,  // MHA/GQA key cache of one layer
  kValue,    // MHA/GQA value cache of one layer
  kLatent,   // MLA compressed latent + rope of one layer (replicated across TP ranks)
  kState,    // a paged state buffer (sliding window, NSA, ...) copied whole per page
  kOpaque,   // a paged buffer whose inner structure is unknown (raw plan requests)
};

// "K", "V", "latent", "state", "opaque".
std::string_view kv_role_name(KvRole role);

// Whether the pages of all layers are interleaved.
enum class PageOrder : uint8_t {
  kLayerMajor = 0,  // each entry is its own array of pages
  kPageMajor,       // one array of pages; each page holds every entry's slice of it
};

struct KvEntry {
  uint64_t base = 0;         // address of page 0 of this entry
  uint64_t bytes = 0;        // bytes reachable from base; bounds the page indices
  uint64_t item_len = 0;     // bytes of one page of this entry (what one page copies)
  uint64_t page_stride = 0;  // distance between consecutive pages; >= item_len
  uint32_t layer_id = 0;
  KvRole role = KvRole::kOpaque;
  bool draft = false;

  // Pages [0, num_pages()) lie inside [base, base + bytes).
  uint64_t num_pages() const { return bytes < item_len ? 0 : (bytes - item_len) / page_stride + 1; }
};

// An entry whose pages are back to back (page_stride == item_len).
KvEntry contiguous_entry(uint64_t base, uint64_t item_len, uint64_t num_pages,
                         KvRole role = KvRole::kOpaque, uint32_t layer_id = 0);

// Model facts a layout was built from. Zero means "not known" for kv_heads, head_dim and
// dtype_bytes (e.g. a raw plan request); head slicing then relies on item lengths alone.
struct KvLayoutInfo {
  uint32_t page_size_tokens = 1;
  uint32_t kv_heads = 0;  // KV heads held on this rank
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 0;
  PageOrder page_order = PageOrder::kLayerMajor;
};

// MHA/GQA on one rank: per layer a K entry of kv_heads x k_head_dim and a V entry of
// kv_heads x v_head_dim per token.
struct MhaShape {
  uint32_t num_layers = 0;
  uint32_t page_size_tokens = 0;
  uint32_t kv_heads = 0;  // on this rank
  uint32_t k_head_dim = 0;
  uint32_t v_head_dim = 0;
  uint32_t dtype_bytes = 0;
  uint64_t num_pages = 0;  // pool capacity in pages
};

// MLA: per layer one entry of bytes_per_token per token (DeepSeek-V3: (512 + 64) x 2 = 1152).
struct MlaShape {
  uint32_t num_layers = 0;
  uint32_t page_size_tokens = 0;
  uint32_t bytes_per_token = 0;
  uint64_t num_pages = 0;
};

class KvLayout {
 public:
  // An empty layout (no entries); create() and the builders make real ones.
  KvLayout() = default;

  // Validates every entry. Errors (InvalidArgument, naming the entry and the value): no
  // entries or more than kMaxLayoutEntries, page_size_tokens 0 or above kMaxPageSizeTokens,
  // item_len 0 or above kMaxItemBytes, page_stride < item_len, bytes < item_len, base + bytes
  // past the end of the address space.
  static Result<KvLayout> create(KvLayoutInfo info, std::vector<KvEntry> entries);

  // Lays an MHA/GQA pool out in one region starting at region_base: K of layers 0..L-1, then
  // V of layers 0..L-1. Layer-major: each entry's pages back to back, entries one after the
  // other. Page-major: page p holds [K0 .. K(L-1), V0 .. V(L-1)] of that page. Errors
  // (InvalidArgument, naming the value): a zero field, num_layers above kMaxLayers,
  // page_size_tokens above kMaxPageSizeTokens, num_pages above kMaxShapePages, a page of one
  // entry above kMaxItemBytes, a region whose size overflows 64 bits or runs past the end of
  // the address space.
  static Result<KvLayout> mha(const MhaShape& shape, uint64_t region_base,
                              PageOrder order = PageOrder::kLayerMajor);
  // MLA pool: one latent entry per layer, laid out (and checked) like mha().
  static Result<KvLayout> mla(const MlaShape& shape, uint64_t region_base,
                              PageOrder order = PageOrder::kLayerMajor);
  // Bytes of the region mha()/mla() lay out (the same for both page orders).
  static Result<uint64_t> region_bytes(const MhaShape& shape);
  static Result<uint64_t> region_bytes(const MlaShape& shape);

  // This layout followed by the draft model's entries (marked draft). The page size must
  // match; the target's info is kept.
  Result<KvLayout> with_draft(const KvLayout& draft) const;

  const KvLayoutInfo& info() const { return info_; }
  std::span<const KvEntry> entries() const { return entries_; }
  size_t num_entries() const { return entries_.size(); }
  const KvEntry& entry(size_t i) const { return entries_[i]; }
  // Pages every entry can hold (the smallest num_pages() over the entries).
  uint64_t num_pages() const { return num_pages_; }

 private:
  KvLayout(KvLayoutInfo info, std::vector<KvEntry> entries, uint64_t num_pages)
      : info_(info), entries_(std::move(entries)), num_pages_(num_pages) {}

  KvLayoutInfo info_;
  std::vector<KvEntry> entries_;
  uint64_t num_pages_ = 0;
};

}  // namespace kvferry::kv
