#include "kvferry/status.h"

#include <gtest/gtest.h>

#include "kvferry/transport_kind.h"

namespace kvferry {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd value " + std::to_string(x));
  return x / 2;
}

Status quarter(int x, int* out) {
  KVF_ASSIGN_OR_RETURN(int h, half(x));
  KVF_ASSIGN_OR_RETURN(int q, half(h));
  *out = q;
  return Status::Ok();
}

TEST(Status, CarriesCodeAndMessageNamingTheValue) {
  Status s = NotRegistered("address 0x10 is outside every registered region");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered);
  EXPECT_EQ(s.to_string(), "NotRegistered: address 0x10 is outside every registered region");
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(Result, PropagatesTheFirstErrorThroughAssignOrReturn) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = quarter(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd value 3");
}

TEST(Result, FromOkStatusIsAnInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultDeathTest, ValueOfAnErrorPrintsTheStatusAndAborts) {
  Result<int> r = InvalidArgument("odd value 3");
  EXPECT_DEATH((void)r.value(), "value\\(\\) called on an error: InvalidArgument: odd value 3");
  EXPECT_DEATH((void)*r, "InvalidArgument: odd value 3");
  Result<std::string> s = NotRegistered("address 0x10");
  EXPECT_DEATH((void)s->size(), "NotRegistered: address 0x10");
  EXPECT_DEATH((void)std::move(s).value(), "NotRegistered: address 0x10");
}

TEST(StatusCode, NumbersAreFixedBecauseTheyTravelOnTheWire) {
  EXPECT_EQ(static_cast<int>(StatusCode::kOk), 0);
  EXPECT_EQ(static_cast<int>(StatusCode::kNotRegistered), 2);
  EXPECT_EQ(static_cast<int>(StatusCode::kTimeout), 9);
  EXPECT_EQ(static_cast<int>(StatusCode::kProtocolError), 12);
  EXPECT_EQ(static_cast<int>(StatusCode::kInternal), 13);
  EXPECT_EQ(static_cast<int>(StatusCode::kDataCorrupted), 14);
  EXPECT_EQ(kLastStatusCode, StatusCode::kDataCorrupted);
}

TEST(StatusCode, EveryNumberUpToTheLastCodeHasAName) {
  for (int n = 0; n <= static_cast<int>(kLastStatusCode); ++n) {
    EXPECT_TRUE(is_valid_status_code(n));
    EXPECT_NE(status_code_name(static_cast<StatusCode>(n)), "Unknown") << n;
  }
  EXPECT_FALSE(is_valid_status_code(static_cast<uint64_t>(kLastStatusCode) + 1));
  EXPECT_FALSE(is_valid_status_code(~uint64_t{0}));
}

TEST(TransportKind, ParsesEveryNameItPrints) {
  for (TransportKind kind : kAllTransportKinds) {
    auto parsed = parse_transport_kind(transport_kind_name(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
}

TEST(TransportKind, UnknownNameIsAnErrorListingTheValidOnes) {
  auto parsed = parse_transport_kind("nvlink");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("'nvlink'"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("shm"), std::string::npos);
}

TEST(TransportSet, InsertEraseIntersect) {
  TransportSet a{TransportKind::kLocal, TransportKind::kShm};
  TransportSet b{TransportKind::kShm, TransportKind::kTcp};
  EXPECT_EQ(a.intersect(b), TransportSet{TransportKind::kShm});
  a.erase(TransportKind::kShm);
  EXPECT_FALSE(a.contains(TransportKind::kShm));
  EXPECT_TRUE(a.contains(TransportKind::kLocal));
}

}  // namespace
}  // namespace kvferry
