#include "transport/tcp/tcp_wire.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "test_support.h"

namespace kvferry {
namespace {

TEST(TcpWire, HeaderRoundTripsEveryField) {
  TcpHeader h;
  h.type = TcpFrame::kWrite;
  h.request_id = 0x1122334455667788ull;
  h.addr = 0x7f0000001000ull;
  h.length = 4096;
  h.deadline_ns = -5;
  h.status = static_cast<uint32_t>(StatusCode::kTimeout);
  std::array<std::byte, kTcpHeaderBytes> raw;
  encode_tcp_header(h, raw.data());
  auto back = decode_tcp_header(raw.data());
  ASSERT_TRUE(back.ok()) << back.status().to_string();
  EXPECT_EQ(back->type, TcpFrame::kWrite);
  EXPECT_EQ(back->request_id, h.request_id);
  EXPECT_EQ(back->addr, h.addr);
  EXPECT_EQ(back->length, 4096u);
  EXPECT_EQ(back->deadline_ns, -5);
  EXPECT_EQ(back->status, h.status);
}

TEST(TcpWire, RejectsBadFieldsNamingThem) {
  TcpHeader h;
  h.type = TcpFrame::kWrite;
  std::array<std::byte, kTcpHeaderBytes> raw;
  auto expect_error = [&](const std::string& needle) {
    auto r = decode_tcp_header(raw.data());
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(testing::contains(r.status().message(), needle)) << r.status().message();
  };
  encode_tcp_header(h, raw.data());
  raw[0] = std::byte{'X'};
  expect_error("magic");
  encode_tcp_header(h, raw.data());
  raw[4] = std::byte{9};
  expect_error("version 9");
  encode_tcp_header(h, raw.data());
  raw[6] = std::byte{99};
  expect_error("type 99");
  h.length = kTcpMaxFrameBytes + 1;
  encode_tcp_header(h, raw.data());
  expect_error("exceeds the limit");
  h.length = 16;
  h.addr = ~0ull - 4;
  encode_tcp_header(h, raw.data());
  expect_error("wraps");
  h.addr = 0;
  h.status = 200;
  encode_tcp_header(h, raw.data());
  expect_error("status code 200");
}

}  // namespace
}  // namespace kvferry
