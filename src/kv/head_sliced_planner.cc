// build_head_sliced_plan: MHA/GQA transfer between ranks of different attention TP sizes,
// one block per token per entry carrying the head slice (sglang's send_kvcache_slice).
#include <string>
#include <vector>

#include "kv/call_schedule.h"
#include "kvferry/kv/planner.h"

namespace kvferry::kv {
namespace {

// Byte geometry of one entry's slice inside a token slot.
struct TokenSlice {
  uint64_t src_token_bytes = 0;
  uint64_t dst_token_bytes = 0;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t bytes = 0;
};

Result<uint64_t> token_bytes(const KvEntry& e, uint32_t page_size, std::string_view where) {
  if (e.item_len % page_size != 0) {
    return InvalidArgument(std::string(where) + "item_len " + std::to_string(e.item_len) +
                           " is not a multiple of the page size " + std::to_string(page_size) +
                           " tokens");
  }
  return e.item_len / page_size;
}

Status check_heads(const KvLayout& layout, uint32_t expected, std::string_view side) {
  const uint32_t heads = layout.info().kv_heads;
  if (heads != 0 && heads != expected) {
    return InvalidArgument(std::string(side) + " layout holds " + std::to_string(heads) +
                           " KV heads per rank, the TP split gives " + std::to_string(expected));
  }
  return Status::Ok();
}

Result<TokenSlice> slice_entry(size_t index, const KvEntry& s, const KvEntry& d, uint32_t page_size,
                               const HeadSlice& heads) {
  const std::string where = "entry " + std::to_string(index) + ": ";
  if (s.role != d.role || s.layer_id != d.layer_id || s.draft != d.draft) {
    return InvalidArgument(where + "source (layer " + std::to_string(s.layer_id) + " " +
                           std::string(kv_role_name(s.role)) + ") and destination (layer " +
                           std::to_string(d.layer_id) + " " + std::string(kv_role_name(d.role)) +
                           ") do not pair");
  }
  if (s.role != KvRole::kKey && s.role != KvRole::kValue) {
    return InvalidArgument(where + "role " + std::string(kv_role_name(s.role)) +
                           " cannot be head-sliced (only K and V; MLA is replicated, plan it "
                           "with build_transfer_plan)");
  }
  TokenSlice t;
  KVF_ASSIGN_OR_RETURN(t.src_token_bytes, token_bytes(s, page_size, where + "source "));
  KVF_ASSIGN_OR_RETURN(t.dst_token_bytes, token_bytes(d, page_size, where + "destination "));
  if (t.src_token_bytes % heads.src_heads_per_rank != 0) {
    return InvalidArgument(where + "source token slot of " + std::to_string(t.src_token_bytes) +
                           " bytes does not split into " +
                           std::to_string(heads.src_heads_per_rank) + " heads");
  }
  const uint64_t head_bytes = t.src_token_bytes / heads.src_heads_per_rank;
  t.bytes = heads.num_heads * head_bytes;
  t.src_offset = heads.src_head_start * head_bytes;
  t.dst_offset = heads.dst_head_start * head_bytes;
  if (t.bytes > t.dst_token_bytes) {
    return InvalidArgument(where + "head slice of " + std::to_string(t.bytes) + " bytes (" +
                           std::to_string(heads.num_heads) + " heads of " +
                           std::to_string(head_bytes) +
                           ") is larger than the destination token slot of " +
                           std::to_string(t.dst_token_bytes) + " bytes");
  }
  if (t.src_offset + t.bytes > t.src_token_bytes) {
    return OutOfRange(where + "head slice [" + std::to_string(t.src_offset) + ", +" +
                      std::to_string(t.bytes) + ") runs past the source token slot of " +
                      std::to_string(t.src_token_bytes) + " bytes");
  }
  if (t.dst_offset + t.bytes > t.dst_token_bytes) {
    return OutOfRange(where + "head slice [" + std::to_string(t.dst_offset) + ", +" +
                      std::to_string(t.bytes) + ") runs past the destination token slot of " +
                      std::to_string(t.dst_token_bytes) + " bytes");
  }
  return t;
}

}  // namespace

Result<TransferPlan> build_head_sliced_plan(const KvLayout& src, const KvLayout& dst,
                                            std::span<const PageIndex> src_pages,
                                            std::span<const PageIndex> dst_pages, const TpPair& tp,
                                            uint32_t total_kv_heads, const PlanOptions& options) {
  KVF_RETURN_IF_ERROR(internal::validate_common(src.num_entries(), dst.num_entries(),
                                                src_pages.size(), dst_pages.size(), options));
  KVF_ASSIGN_OR_RETURN(const HeadSlice heads, compute_head_slice(tp, total_kv_heads));
  const uint32_t page_size = src.info().page_size_tokens;
  if (dst.info().page_size_tokens != page_size) {
    return InvalidArgument("page sizes differ: source " + std::to_string(page_size) +
                           " tokens, destination " + std::to_string(dst.info().page_size_tokens));
  }
  KVF_RETURN_IF_ERROR(check_heads(src, heads.src_heads_per_rank, "source"));
  KVF_RETURN_IF_ERROR(check_heads(dst, heads.dst_heads_per_rank, "destination"));
  std::vector<TokenSlice> slices(src.num_entries());
  for (size_t e = 0; e < src.num_entries(); ++e) {
    KVF_ASSIGN_OR_RETURN(slices[e], slice_entry(e, src.entry(e), dst.entry(e), page_size, heads));
  }
  KVF_RETURN_IF_ERROR(internal::validate_pages_fit(src, src_pages, "src"));
  KVF_RETURN_IF_ERROR(internal::validate_pages_fit(dst, dst_pages, "dst"));

  const internal::CallSchedule schedule = internal::schedule_calls(src_pages, dst_pages, options);
  TransferPlan plan(options.strategy, options.coalesce);
  plan.reserve(src.num_entries() * src_pages.size() * page_size,
               internal::count_calls(schedule, src.num_entries(), options.strategy));
  internal::emit_calls(
      plan, schedule, src.num_entries(), options.strategy,
      [&](size_t first, size_t end, std::span<const PageRun> runs) {
        for (size_t e = first; e < end; ++e) {
          const KvEntry& s = src.entry(e);
          const KvEntry& d = dst.entry(e);
          const TokenSlice& t = slices[e];
          for (const PageRun& run : runs) {
            for (uint64_t k = 0; k < run.length; ++k) {
              const uint64_t src_page = s.base + (run.src_first + k) * s.page_stride + t.src_offset;
              const uint64_t dst_page = d.base + (run.dst_first + k) * d.page_stride + t.dst_offset;
              for (uint64_t token = 0; token < page_size; ++token) {
                plan.add_block(src_page + token * t.src_token_bytes,
                               dst_page + token * t.dst_token_bytes, t.bytes);
              }
            }
          }
        }
      });
  plan.finish();
  return plan;
}

}  // namespace kvferry::kv
