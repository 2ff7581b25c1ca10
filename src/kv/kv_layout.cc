#include "kvferry/kv/kv_layout.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <string>

namespace kvferry::kv {
namespace {

constexpr uint64_t kMaxAddress = std::numeric_limits<uint64_t>::max();

std::string describe(size_t index, const KvEntry& e) {
  return "entry " + std::to_string(index) + " (layer " + std::to_string(e.layer_id) + " " +
         std::string(kv_role_name(e.role)) + (e.draft ? ", draft" : "") + ")";
}

// a * b, or an error naming `what` when it does not fit in 64 bits.
Result<uint64_t> checked_mul(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return InvalidArgument(std::string(what) + " overflows 64 bits (" + std::to_string(a) + " x " +
                           std::to_string(b) + ")");
  }
  return out;
}

Status require_positive(uint64_t value, std::string_view field) {
  if (value == 0) return InvalidArgument(std::string(field) + " must be > 0, got 0");
  return Status::Ok();
}

// 1 <= value <= most, or an error naming the field and the value.
Status require_in_range(uint64_t value, uint64_t most, std::string_view field) {
  KVF_RETURN_IF_ERROR(require_positive(value, field));
  if (value > most) {
    return InvalidArgument(std::string(field) + " " + std::to_string(value) + " out of range 1.." +
                           std::to_string(most));
  }
  return Status::Ok();
}

// The product of `factors`: bytes of one page of one entry, at most kMaxItemBytes.
Result<uint64_t> item_bytes(std::initializer_list<uint64_t> factors, std::string_view what) {
  uint64_t bytes = 1;
  for (uint64_t f : factors) {
    if (__builtin_mul_overflow(bytes, f, &bytes) || bytes > kMaxItemBytes) {
      return InvalidArgument(std::string(what) + " exceeds " + std::to_string(kMaxItemBytes) +
                             " bytes per page");
    }
  }
  return bytes;
}

// Lays out entries with the given per-page item lengths in one region. Layer-major: entry
// after entry, each num_pages long. Page-major: page after page, each holding every entry.
Result<KvLayout> lay_out_region(KvLayoutInfo info, std::span<const uint64_t> item_lens,
                                std::span<const KvRole> roles, std::span<const uint32_t> layer_ids,
                                uint64_t num_pages, uint64_t region_base) {
  // At most 2 x kMaxLayers items of at most kMaxItemBytes each: the sum fits in 64 bits.
  uint64_t page_bytes = 0;
  for (uint64_t len : item_lens) page_bytes += len;
  KVF_ASSIGN_OR_RETURN(uint64_t region, checked_mul(page_bytes, num_pages, "region bytes"));
  if (region > kMaxAddress - region_base) {
    return InvalidArgument("region of " + std::to_string(region) + " bytes at " +
                           std::to_string(region_base) + " runs past the address space");
  }
  std::vector<KvEntry> entries(item_lens.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < item_lens.size(); ++i) {
    KvEntry& e = entries[i];
    e.item_len = item_lens[i];
    e.role = roles[i];
    e.layer_id = layer_ids[i];
    if (info.page_order == PageOrder::kLayerMajor) {
      e.base = region_base + offset;
      e.page_stride = e.item_len;
      e.bytes = e.item_len * num_pages;
      offset += e.bytes;
    } else {
      e.base = region_base + offset;
      e.page_stride = page_bytes;
      e.bytes = region - offset;
      offset += e.item_len;
    }
  }
  return KvLayout::create(info, std::move(entries));
}

// The bytes of one page of a K and of a V entry.
struct MhaItems {
  uint64_t k = 0;
  uint64_t v = 0;
};

Result<MhaItems> validate(const MhaShape& s) {
  KVF_RETURN_IF_ERROR(require_in_range(s.num_layers, kMaxLayers, "num_layers"));
  KVF_RETURN_IF_ERROR(require_in_range(s.page_size_tokens, kMaxPageSizeTokens, "page_size_tokens"));
  KVF_RETURN_IF_ERROR(require_positive(s.kv_heads, "kv_heads"));
  KVF_RETURN_IF_ERROR(require_positive(s.k_head_dim, "k_head_dim"));
  KVF_RETURN_IF_ERROR(require_positive(s.v_head_dim, "v_head_dim"));
  KVF_RETURN_IF_ERROR(require_positive(s.dtype_bytes, "dtype_bytes"));
  KVF_RETURN_IF_ERROR(require_in_range(s.num_pages, kMaxShapePages, "num_pages"));
  const std::string heads = " (page_size_tokens " + std::to_string(s.page_size_tokens) +
                            " x kv_heads " + std::to_string(s.kv_heads) + " x dtype_bytes " +
                            std::to_string(s.dtype_bytes) + " x ";
  KVF_ASSIGN_OR_RETURN(
      uint64_t k,
      item_bytes({s.page_size_tokens, s.kv_heads, s.dtype_bytes, s.k_head_dim},
                 "a K page" + heads + "k_head_dim " + std::to_string(s.k_head_dim) + ")"));
  KVF_ASSIGN_OR_RETURN(
      uint64_t v,
      item_bytes({s.page_size_tokens, s.kv_heads, s.dtype_bytes, s.v_head_dim},
                 "a V page" + heads + "v_head_dim " + std::to_string(s.v_head_dim) + ")"));
  return MhaItems{k, v};
}

// The bytes of one page of a latent entry.
Result<uint64_t> validate(const MlaShape& s) {
  KVF_RETURN_IF_ERROR(require_in_range(s.num_layers, kMaxLayers, "num_layers"));
  KVF_RETURN_IF_ERROR(require_in_range(s.page_size_tokens, kMaxPageSizeTokens, "page_size_tokens"));
  KVF_RETURN_IF_ERROR(require_positive(s.bytes_per_token, "bytes_per_token"));
  KVF_RETURN_IF_ERROR(require_in_range(s.num_pages, kMaxShapePages, "num_pages"));
  return item_bytes({s.page_size_tokens, s.bytes_per_token},
                    "a latent page (page_size_tokens " + std::to_string(s.page_size_tokens) +
                        " x bytes_per_token " + std::to_string(s.bytes_per_token) + ")");
}

}  // namespace

std::string_view kv_role_name(KvRole role) {
  switch (role) {
    case KvRole::kKey: return "K";
    case KvRole::kValue: return "V";
    case KvRole::kLatent: return "latent";
    case KvRole::kState: return "state";
    case KvRole::kOpaque: return "opaque";
  }
  return "unknown";
}

KvEntry contiguous_entry(uint64_t base, uint64_t item_len, uint64_t num_pages, KvRole role,
                         uint32_t layer_id) {
  KvEntry e;
  e.base = base;
  e.item_len = item_len;
  e.page_stride = item_len;
  e.bytes = item_len * num_pages;
  e.role = role;
  e.layer_id = layer_id;
  return e;
}

Result<KvLayout> KvLayout::create(KvLayoutInfo info, std::vector<KvEntry> entries) {
  if (entries.empty()) return InvalidArgument("a KV layout needs at least one entry, got 0");
  if (entries.size() > kMaxLayoutEntries) {
    return InvalidArgument("a KV layout of " + std::to_string(entries.size()) +
                           " entries exceeds the limit of " + std::to_string(kMaxLayoutEntries));
  }
  KVF_RETURN_IF_ERROR(
      require_in_range(info.page_size_tokens, kMaxPageSizeTokens, "page_size_tokens"));
  uint64_t num_pages = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < entries.size(); ++i) {
    const KvEntry& e = entries[i];
    if (e.item_len == 0) return InvalidArgument(describe(i, e) + ": item_len 0 must be > 0");
    if (e.item_len > kMaxItemBytes) {
      return InvalidArgument(describe(i, e) + ": item_len " + std::to_string(e.item_len) +
                             " out of range 1.." + std::to_string(kMaxItemBytes));
    }
    if (e.page_stride < e.item_len) {
      return InvalidArgument(describe(i, e) + ": page_stride " + std::to_string(e.page_stride) +
                             " is smaller than item_len " + std::to_string(e.item_len));
    }
    if (e.bytes < e.item_len) {
      return InvalidArgument(describe(i, e) + ": bytes " + std::to_string(e.bytes) +
                             " cannot hold one page of item_len " + std::to_string(e.item_len));
    }
    if (e.bytes > kMaxAddress - e.base) {
      return InvalidArgument(describe(i, e) + ": base " + std::to_string(e.base) + " + bytes " +
                             std::to_string(e.bytes) + " runs past the address space");
    }
    num_pages = std::min(num_pages, e.num_pages());
  }
  return KvLayout(info, std::move(entries), num_pages);
}

Result<uint64_t> KvLayout::region_bytes(const MhaShape& s) {
  KVF_ASSIGN_OR_RETURN(MhaItems items, validate(s));
  // Both items are at most kMaxItemBytes (2^40): their sum does not overflow.
  KVF_ASSIGN_OR_RETURN(uint64_t per_page,
                       checked_mul(items.k + items.v, s.num_layers, "page bytes"));
  return checked_mul(per_page, s.num_pages, "region bytes");
}

Result<uint64_t> KvLayout::region_bytes(const MlaShape& s) {
  KVF_ASSIGN_OR_RETURN(uint64_t item, validate(s));
  KVF_ASSIGN_OR_RETURN(uint64_t per_page, checked_mul(item, s.num_layers, "page bytes"));
  return checked_mul(per_page, s.num_pages, "region bytes");
}

Result<KvLayout> KvLayout::mha(const MhaShape& s, uint64_t region_base, PageOrder order) {
  KVF_ASSIGN_OR_RETURN(MhaItems items, validate(s));
  const uint64_t k_item = items.k;
  const uint64_t v_item = items.v;
  const size_t n = 2 * size_t{s.num_layers};
  std::vector<uint64_t> item_lens(n);
  std::vector<KvRole> roles(n);
  std::vector<uint32_t> layer_ids(n);
  for (uint32_t layer = 0; layer < s.num_layers; ++layer) {
    item_lens[layer] = k_item;
    roles[layer] = KvRole::kKey;
    layer_ids[layer] = layer;
    item_lens[s.num_layers + layer] = v_item;
    roles[s.num_layers + layer] = KvRole::kValue;
    layer_ids[s.num_layers + layer] = layer;
  }
  KvLayoutInfo info{.page_size_tokens = s.page_size_tokens,
                    .kv_heads = s.kv_heads,
                    .head_dim = s.k_head_dim,
                    .dtype_bytes = s.dtype_bytes,
                    .page_order = order};
  return lay_out_region(info, item_lens, roles, layer_ids, s.num_pages, region_base);
}

Result<KvLayout> KvLayout::mla(const MlaShape& s, uint64_t region_base, PageOrder order) {
  KVF_ASSIGN_OR_RETURN(uint64_t item, validate(s));
  std::vector<uint64_t> item_lens(s.num_layers, item);
  std::vector<KvRole> roles(s.num_layers, KvRole::kLatent);
  std::vector<uint32_t> layer_ids(s.num_layers);
  for (uint32_t layer = 0; layer < s.num_layers; ++layer) layer_ids[layer] = layer;
  KvLayoutInfo info{.page_size_tokens = s.page_size_tokens, .page_order = order};
  return lay_out_region(info, item_lens, roles, layer_ids, s.num_pages, region_base);
}

Result<KvLayout> KvLayout::with_draft(const KvLayout& draft) const {
  if (draft.info_.page_size_tokens != info_.page_size_tokens) {
    return InvalidArgument("draft page size " + std::to_string(draft.info_.page_size_tokens) +
                           " differs from the target's " + std::to_string(info_.page_size_tokens));
  }
  std::vector<KvEntry> entries = entries_;
  for (KvEntry e : draft.entries_) {
    e.draft = true;
    entries.push_back(e);
  }
  return create(info_, std::move(entries));
}

}  // namespace kvferry::kv
