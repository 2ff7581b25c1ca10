// JSON plan requests and plans (docs/PLAN_FORMAT.md). nlohmann::json does the parsing; this
// file only maps fields to the planner's types and names every bad value it finds.
#include "kvferry/kv/plan_json.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "core/json_excerpt.h"
#include "core/json_fields.h"

namespace kvferry::kv {
namespace {

using nlohmann::json;

const JsonErrors kErrors{StatusCode::kInvalidArgument, ""};
constexpr std::string_view kHeadSliceField = "head_slice";
constexpr std::array<std::string_view, 6> kHeadSliceFields = {
    "prefill_tp_size", "prefill_tp_rank", "decode_tp_size",
    "decode_tp_rank",  "total_kv_heads",  "page_size_tokens"};

Status field_error(std::string_view field, const std::string& what) {
  return InvalidArgument("field '" + std::string(field) + "': " + what);
}

std::string show(const json& value) { return json_excerpt(value); }

Result<HeadSliceRequest> parse_head_slice(JsonFields f) {
  std::array<uint32_t, kHeadSliceFields.size()> numbers{};
  for (size_t i = 0; i < kHeadSliceFields.size(); ++i) {
    KVF_RETURN_IF_ERROR(f.required(kHeadSliceFields[i], numbers[i]));
  }
  KVF_RETURN_IF_ERROR(f.finish());
  HeadSliceRequest request;
  request.tp = TpPair{numbers[0], numbers[1], numbers[2], numbers[3]};
  request.total_kv_heads = numbers[4];
  request.page_size_tokens = numbers[5];
  KVF_RETURN_IF_ERROR(validate_tp_pair(request.tp));
  if (request.total_kv_heads == 0) {
    return field_error("head_slice.total_kv_heads", "0 must be > 0");
  }
  if (request.page_size_tokens == 0) {
    return field_error("head_slice.page_size_tokens", "0 must be > 0");
  }
  return request;
}

// Entry i of one side: base ptrs[i], item_lens[i], bytes from `bytes` or, when absent, just
// enough for the highest page the request names.
Result<KvLayout> make_layout(std::string_view side, const std::vector<uint64_t>& ptrs,
                             const std::vector<uint64_t>& item_lens,
                             const std::vector<uint64_t>& bytes, std::span<const PageIndex> pages,
                             const std::optional<HeadSliceRequest>& head_slice) {
  const uint64_t highest = pages.empty() ? 0 : *std::max_element(pages.begin(), pages.end());
  const size_t half = ptrs.size() / 2;
  std::vector<KvEntry> entries(ptrs.size());
  for (size_t i = 0; i < ptrs.size(); ++i) {
    KvEntry& e = entries[i];
    e.base = ptrs[i];
    e.item_len = item_lens[i];
    e.page_stride = item_lens[i];
    if (!bytes.empty()) {
      e.bytes = bytes[i];
    } else if (__builtin_mul_overflow(highest + 1, e.item_len, &e.bytes)) {
      return field_error(side == "src" ? "src_pages" : "dst_pages",
                         "page " + std::to_string(highest) + " x item_len " +
                             std::to_string(e.item_len) + " overflows 64 bits");
    }
    if (head_slice) {
      e.role = i < half ? KvRole::kKey : KvRole::kValue;
      e.layer_id = static_cast<uint32_t>(i < half ? i : i - half);
    } else {
      e.role = KvRole::kOpaque;
      e.layer_id = static_cast<uint32_t>(i);
    }
  }
  KvLayoutInfo info;
  if (head_slice) info.page_size_tokens = head_slice->page_size_tokens;
  Result<KvLayout> layout = KvLayout::create(info, std::move(entries));
  if (!layout.ok()) {
    return InvalidArgument(std::string(side) + " entries: " + layout.status().message());
  }
  return layout;
}

void append_number(std::string& out, uint64_t value) {
  std::array<char, 24> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  out.append(buffer.data(), end);
}

}  // namespace

Result<PlanRequest> parse_plan_request(std::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::parse_error& e) {
    return InvalidArgument(std::string("request is not valid JSON: ") + e.what());
  }
  if (!root.is_object()) return InvalidArgument("request " + show(root) + " is not a JSON object");
  KVF_ASSIGN_OR_RETURN(JsonFields f, JsonFields::of(root, "request", kErrors));

  KVF_ASSIGN_OR_RETURN(std::vector<uint64_t> src_ptrs, f.required_list<uint64_t>("src_ptrs"));
  KVF_ASSIGN_OR_RETURN(std::vector<uint64_t> dst_ptrs, f.required_list<uint64_t>("dst_ptrs"));
  KVF_ASSIGN_OR_RETURN(std::vector<uint64_t> item_lens, f.required_list<uint64_t>("item_lens"));

  PlanRequest request;
  KVF_ASSIGN_OR_RETURN(request.src_pages, f.required_list<PageIndex>("src_pages"));
  KVF_ASSIGN_OR_RETURN(request.dst_pages, f.required_list<PageIndex>("dst_pages"));

  KVF_ASSIGN_OR_RETURN(std::optional<std::vector<uint64_t>> dst_item_lens_field,
                       f.optional_list<uint64_t>("dst_item_lens"));
  std::vector<uint64_t> dst_item_lens = dst_item_lens_field.value_or(item_lens);
  KVF_ASSIGN_OR_RETURN(std::optional<std::vector<uint64_t>> src_bytes_field,
                       f.optional_list<uint64_t>("src_entry_bytes"));
  KVF_ASSIGN_OR_RETURN(std::optional<std::vector<uint64_t>> dst_bytes_field,
                       f.optional_list<uint64_t>("dst_entry_bytes"));
  const std::vector<uint64_t> src_bytes = src_bytes_field.value_or(std::vector<uint64_t>{});
  const std::vector<uint64_t> dst_bytes = dst_bytes_field.value_or(std::vector<uint64_t>{});
  KVF_ASSIGN_OR_RETURN(std::optional<std::string> strategy_name,
                       f.optional<std::string>("strategy"));
  if (strategy_name) {
    Result<SendStrategy> strategy = parse_send_strategy(*strategy_name);
    if (!strategy.ok()) return field_error("strategy", strategy.status().message());
    request.options.strategy = *strategy;
  }
  KVF_RETURN_IF_ERROR(f.optional("max_pages_per_call", request.options.max_pages_per_call));
  KVF_RETURN_IF_ERROR(f.optional("coalesce", request.options.coalesce));
  KVF_ASSIGN_OR_RETURN(std::optional<JsonFields> head_slice, f.optional_object(kHeadSliceField));
  KVF_RETURN_IF_ERROR(f.finish());
  if (head_slice) {
    KVF_ASSIGN_OR_RETURN(request.head_slice, parse_head_slice(std::move(*head_slice)));
  }

  // Per-entry lists must all have one value per entry.
  const size_t entries = src_ptrs.size();
  const std::array<std::pair<std::string_view, size_t>, 5> sizes = {{
      {"dst_ptrs", dst_ptrs.size()},
      {"item_lens", item_lens.size()},
      {"dst_item_lens", dst_item_lens.size()},
      {"src_entry_bytes", src_bytes.empty() ? entries : src_bytes.size()},
      {"dst_entry_bytes", dst_bytes.empty() ? entries : dst_bytes.size()},
  }};
  if (entries == 0) return field_error("src_ptrs", "[] names no entry");
  for (const auto& [field, size] : sizes) {
    if (size != entries) {
      return field_error(field, "has " + std::to_string(size) + " values but src_ptrs has " +
                                    std::to_string(entries) + " entries");
    }
  }
  if (request.head_slice && entries % 2 != 0) {
    return field_error("src_ptrs", std::to_string(entries) +
                                       " entries cannot be split into K and V halves for "
                                       "head_slice");
  }
  if (request.options.max_pages_per_call != 0 &&
      request.options.strategy != SendStrategy::kIndexSharded) {
    return field_error("max_pages_per_call",
                       std::to_string(request.options.max_pages_per_call) +
                           " applies only to strategy index_sharded, not " +
                           std::string(send_strategy_name(request.options.strategy)));
  }
  KVF_ASSIGN_OR_RETURN(request.src_layout, make_layout("src", src_ptrs, item_lens, src_bytes,
                                                       request.src_pages, request.head_slice));
  KVF_ASSIGN_OR_RETURN(request.dst_layout, make_layout("dst", dst_ptrs, dst_item_lens, dst_bytes,
                                                       request.dst_pages, request.head_slice));
  return request;
}

Result<TransferPlan> build_requested_plan(const PlanRequest& request) {
  if (request.head_slice) {
    return build_head_sliced_plan(request.src_layout, request.dst_layout, request.src_pages,
                                  request.dst_pages, request.head_slice->tp,
                                  request.head_slice->total_kv_heads, request.options);
  }
  return build_transfer_plan(request.src_layout, request.dst_layout, request.src_pages,
                             request.dst_pages, request.options);
}

std::string plan_to_json(const TransferPlan& plan) {
  std::string out = "{\"calls\": [";
  out.reserve(32 + plan.num_blocks() * 40);
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    if (c > 0) out += ", ";
    out += "{\"blocks\": [";
    const PlanCall call = plan.call(c);
    for (size_t b = 0; b < call.num_blocks(); ++b) {
      if (b > 0) out += ", ";
      out += '[';
      append_number(out, call.src[b]);
      out += ", ";
      append_number(out, call.dst[b]);
      out += ", ";
      append_number(out, call.len[b]);
      out += ']';
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace kvferry::kv
