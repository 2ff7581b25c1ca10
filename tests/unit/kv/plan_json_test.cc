// The JSON edge of the planner: requests as `kvferry plan` reads them, plans as it writes them.
#include "kvferry/kv/plan_json.h"

#include <gtest/gtest.h>

#include <string>

namespace kvferry::kv {
namespace {

constexpr const char* kTwoEntries =
    R"({"src_ptrs": [1000, 2000], "dst_ptrs": [5000, 6000], "item_lens": [10, 20],
        "src_pages": [0, 1, 2, 3, 4], "dst_pages": [10, 11, 12, 13, 14],)";

std::string request(const std::string& tail) { return std::string(kTwoEntries) + tail + "}"; }

Result<std::string> plan_json(const std::string& text) {
  KVF_ASSIGN_OR_RETURN(PlanRequest parsed, parse_plan_request(text));
  KVF_ASSIGN_OR_RETURN(TransferPlan plan, build_requested_plan(parsed));
  return plan_to_json(plan);
}

TEST(PlanJson, IndexShardedRequestGivesTheIssuesCalls) {
  Result<std::string> out = plan_json(
      request(R"("strategy": "index_sharded", "max_pages_per_call": 2, "coalesce": false)"));
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, R"({"calls": [{"blocks": [[1000, 5100, 20], [2000, 6200, 40]]}, )"
                  R"({"blocks": [[1020, 5120, 20], [2040, 6240, 40]]}, )"
                  R"({"blocks": [[1040, 5140, 10], [2080, 6280, 20]]}]})");
}

TEST(PlanJson, PerLayerCallsComeInEntryOrder) {
  Result<std::string> out = plan_json(request(R"("strategy": "per_layer")"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out,
            R"({"calls": [{"blocks": [[1000, 5100, 50]]}, {"blocks": [[2000, 6200, 100]]}]})");
}

TEST(PlanJson, DefaultsAreAllLayersCoalescedWithoutLimit) {
  Result<PlanRequest> parsed = parse_plan_request(request(R"("max_pages_per_call": 0)"));
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  EXPECT_EQ(parsed->options.strategy, SendStrategy::kAllLayers);
  EXPECT_TRUE(parsed->options.coalesce);
  EXPECT_FALSE(parsed->head_slice.has_value());
  Result<std::string> out = plan_json(request(R"("strategy": "all_layers")"));
  EXPECT_EQ(*out, R"({"calls": [{"blocks": [[1000, 5100, 50], [2000, 6200, 100]]}]})");
}

TEST(PlanJson, EmptyPagesGiveNoCalls) {
  Result<std::string> out = plan_json(
      R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [], "dst_pages": []})");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, R"({"calls": []})");
}

TEST(PlanJson, HeadSliceRequestSendsOneBlockPerToken) {
  // One layer (K, V) of 2 tokens per page; P=1 -> D=2 with 2 heads: decode rank 1 takes head 1.
  Result<std::string> out = plan_json(
      R"({"src_ptrs": [0, 1000], "dst_ptrs": [5000, 6000], "item_lens": [32, 32],
          "dst_item_lens": [16, 16], "src_pages": [1], "dst_pages": [2], "coalesce": false,
          "head_slice": {"prefill_tp_size": 1, "prefill_tp_rank": 0, "decode_tp_size": 2,
                         "decode_tp_rank": 1, "total_kv_heads": 2, "page_size_tokens": 2}})");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(*out, R"({"calls": [{"blocks": [[40, 5032, 8], [56, 5040, 8], )"
                  R"([1040, 6032, 8], [1056, 6040, 8]]}]})");
}

struct BadRequest {
  std::string json;
  std::vector<std::string> expected;  // substrings of the message
};

TEST(PlanJson, EveryBadFieldIsInvalidArgumentNamingFieldAndValue) {
  const BadRequest cases[] = {
      {request(R"("strategy": "fast")"), {"'strategy'", "'fast'", "all_layers"}},
      {request(R"("strategy": 3)"), {"'strategy'", "3"}},
      {request(R"("coalesce": "yes")"), {"'coalesce'", "\"yes\""}},
      {request(R"("max_pages_per_call": -2)"), {"'max_pages_per_call'", "-2"}},
      {request(R"("max_pages_per_call": 2)"), {"'max_pages_per_call'", "all_layers"}},
      {request(R"("max_page_per_call": 2)"), {"unknown field 'max_page_per_call'"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [0, -1], "dst_pages": [0, 1]})",
       {"'src_pages[1]'", "-1"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [0, 1.5], "dst_pages": [0, 1]})",
       {"'src_pages[1]'", "1.5"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [4294967296], "dst_pages": [0]})",
       {"'src_pages[0]'", "4294967296"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [0]})",
       {"missing field 'dst_pages'"}},
      {R"({"src_ptrs": [1, 2], "dst_ptrs": [2], "item_lens": [3, 3], "src_pages": [0], "dst_pages": [0]})",
       {"'dst_ptrs'", "1 values", "2 entries"}},
      {R"({"src_ptrs": [1, 2], "dst_ptrs": [5, 6], "item_lens": [3, 0], "src_pages": [0], "dst_pages": [0]})",
       {"entry 1", "item_len 0"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [0, 1], "dst_pages": [0]})",
       {"src_pages has 2", "dst_pages has 1"}},
      {R"({"src_ptrs": [1], "dst_ptrs": [2], "item_lens": [3], "src_pages": [9], "dst_pages": [0],
           "src_entry_bytes": [12]})",
       {"src page 9", "4 pages"}},
      {request(R"("head_slice": {"prefill_tp_size": 3})"), {"head_slice.", "prefill_tp_rank"}},
      {"[1, 2]", {"not a JSON object"}},
      {"{", {"not valid JSON"}},
  };
  for (const BadRequest& c : cases) {
    Result<std::string> out = plan_json(c.json);
    ASSERT_FALSE(out.ok()) << c.json;
    const bool out_of_range = out.status().code() == StatusCode::kOutOfRange;
    EXPECT_TRUE(out.status().code() == StatusCode::kInvalidArgument || out_of_range) << c.json;
    for (const std::string& part : c.expected) {
      EXPECT_NE(out.status().message().find(part), std::string::npos)
          << "'" << part << "' not in: " << out.status().message();
    }
  }
}

}  // namespace
}  // namespace kvferry::kv
