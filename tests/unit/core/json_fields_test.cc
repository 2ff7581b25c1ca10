#include "core/json_fields.h"

#include <gtest/gtest.h>

#include <string>

#include "test_support.h"

namespace kvferry {
namespace {

using nlohmann::json;
using testing::contains;

const JsonErrors kPeer{StatusCode::kProtocolError, "malformed thing"};

JsonFields fields_of(const json& j) { return testing::must(JsonFields::of(j, "thing", kPeer)); }

TEST(JsonFields, ReadsRequiredAndOptionalTypedFields) {
  const json j = json::parse(R"({"n": 7, "s": "x", "b": true, "i": -3, "l": [1, 2]})");
  JsonFields f = fields_of(j);
  EXPECT_EQ(testing::must(f.required<uint32_t>("n")), 7u);
  EXPECT_EQ(testing::must(f.required<std::string>("s")), "x");
  EXPECT_TRUE(testing::must(f.required<bool>("b")));
  EXPECT_EQ(testing::must(f.required<int64_t>("i")), -3);
  EXPECT_EQ(testing::must(f.required_list<uint64_t>("l")), (std::vector<uint64_t>{1, 2}));
  uint16_t absent = 42;
  EXPECT_TRUE(f.optional("missing", absent).ok());
  EXPECT_EQ(absent, 42);  // left at its default
  EXPECT_FALSE(testing::must(f.optional<std::string>("also_missing")).has_value());
  EXPECT_TRUE(f.finish().ok());
}

TEST(JsonFields, MissingFieldIsNamedWithTheReadersCodeAndContext) {
  const json j = json::object();
  JsonFields f = fields_of(j);
  Result<uint64_t> r = f.required<uint64_t>("addr");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
  EXPECT_EQ(r.status().message(), "malformed thing: missing field 'addr'");
}

TEST(JsonFields, WrongTypeNamesTheFieldTheExpectedTypeAndTheValue) {
  struct Case {
    const char* json;
    const char* message;
  };
  const Case cases[] = {
      {R"({"v": -5})", "field 'v' is not a non-negative integer up to 65535: -5"},
      {R"({"v": 65536})", "field 'v' is not a non-negative integer up to 65535: 65536"},
      {R"({"v": 1.5})", "field 'v' is not a non-negative integer up to 65535: 1.5"},
      {R"({"v": "7"})", "field 'v' is not a non-negative integer up to 65535: \"7\""},
      {R"({"v": [[[]]]})", "field 'v' is not a non-negative integer up to 65535: an array"},
  };
  for (const Case& c : cases) {
    const json j = json::parse(c.json);
    JsonFields f = fields_of(j);
    Result<uint16_t> r = f.required<uint16_t>("v");
    ASSERT_FALSE(r.ok()) << c.json;
    EXPECT_TRUE(contains(r.status().message(), c.message)) << r.status().message();
  }
}

TEST(JsonFields, SignedFieldsRejectUnsignedValuesBeyondTheirRange) {
  const json j = json::parse(R"({"pid": 18446744073709551615, "small": -129})");
  JsonFields f = fields_of(j);
  Result<int64_t> pid = f.required<int64_t>("pid");
  ASSERT_FALSE(pid.ok());  // must not wrap to -1
  EXPECT_TRUE(contains(pid.status().message(), "'pid' is not a 64-bit signed integer"));
  EXPECT_FALSE(f.required<int8_t>("small").ok());
}

TEST(JsonFields, UnknownFieldsAreRejectedByFinish) {
  const json j = json::parse(R"({"known": 1, "coalsce": true})");
  JsonFields f = fields_of(j);
  ASSERT_TRUE(f.required<uint64_t>("known").ok());
  Status s = f.finish();
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
  EXPECT_EQ(s.message(), "malformed thing: unknown field 'coalsce'");
}

TEST(JsonFields, AnOptionalFieldAskedForIsKnownEvenWhenAbsent) {
  const json j = json::parse(R"({"a": 1})");
  JsonFields f = fields_of(j);
  ASSERT_TRUE(f.optional<uint64_t>("b").ok());
  ASSERT_TRUE(f.optional<uint64_t>("a").ok());
  EXPECT_TRUE(f.finish().ok());
}

TEST(JsonFields, NestedObjectsAndListElementsAreNamedByTheirPath) {
  const json j = json::parse(R"({"head": {"rank": "x", "extra": 1}, "pages": [0, -1]})");
  JsonFields f = fields_of(j);
  JsonFields head = testing::must(f.required_object("head"));
  Result<uint32_t> rank = head.required<uint32_t>("rank");
  ASSERT_FALSE(rank.ok());
  EXPECT_TRUE(contains(rank.status().message(), "field 'head.rank'")) << rank.status().message();
  EXPECT_TRUE(contains(head.finish().message(), "unknown field 'head.extra'"));
  Result<std::vector<uint32_t>> pages = f.required_list<uint32_t>("pages");
  ASSERT_FALSE(pages.ok());
  EXPECT_TRUE(contains(pages.status().message(), "field 'pages[1]'"));
  EXPECT_TRUE(contains(pages.status().message(), "-1"));
}

TEST(JsonFields, ContainersOfTheWrongKindAreNamed) {
  const json j = json::parse(R"({"list": 3, "obj": [1]})");
  JsonFields f = fields_of(j);
  EXPECT_TRUE(
      contains(f.required_array("list").status().message(), "field 'list' is not an array: 3"));
  EXPECT_TRUE(contains(f.required_object("obj").status().message(),
                       "field 'obj' is not an object: an array"));
  Result<JsonFields> top = JsonFields::of(json::array(), "thing", kPeer);
  ASSERT_FALSE(top.ok());
  EXPECT_TRUE(contains(top.status().message(), "thing is not an object: an array"));
}

}  // namespace
}  // namespace kvferry
