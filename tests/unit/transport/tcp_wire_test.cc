#include "transport/tcp/tcp_wire.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <span>
#include <string>
#include <vector>

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

TcpHeader vector_header(TcpFrame type, uint64_t count, uint64_t length) {
  TcpHeader h;
  h.type = type;
  h.request_id = 3;
  h.addr = count;
  h.length = length;
  return h;
}

// Encodes the header, decodes it, and decodes `entries` as its table.
Status decode_table_of(const TcpHeader& h, std::span<const TcpVecEntry> entries,
                       std::vector<TcpVecEntry>& out) {
  std::array<std::byte, kTcpHeaderBytes> raw;
  encode_tcp_header(h, raw.data());
  auto back = decode_tcp_header(raw.data());
  if (!back.ok()) return back.status();
  std::vector<std::byte> table(entries.size() * kTcpVecEntryBytes);
  encode_tcp_table(entries, table.data());
  if (tcp_table_bytes(*back) != table.size()) return Internal("table size mismatch");
  out.assign(back->addr, {});
  return decode_tcp_table(*back, table.data(), out);
}

TEST(TcpWire, VectorTableRoundTripsEveryEntry) {
  const std::vector<TcpVecEntry> entries = {
      {0x7f0000001000ull, 4096}, {0x10, 1}, {~0ull - 100, 100}, {0x7f0000100000ull, 65536}};
  uint64_t total = 0;
  for (const TcpVecEntry& e : entries) total += e.length;
  for (TcpFrame type : {TcpFrame::kWriteV, TcpFrame::kReadV}) {
    std::vector<TcpVecEntry> out;
    Status s = decode_table_of(vector_header(type, entries.size(), total), entries, out);
    ASSERT_TRUE(s.ok()) << s.to_string();
    ASSERT_EQ(out.size(), entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      EXPECT_EQ(out[i].addr, entries[i].addr) << i;
      EXPECT_EQ(out[i].length, entries[i].length) << i;
    }
  }
  EXPECT_TRUE(tcp_frame_has_payload(TcpFrame::kWriteV));
  EXPECT_FALSE(tcp_frame_has_payload(TcpFrame::kReadV));
}

TEST(TcpWire, VectorHeaderRejectsAbsurdCountsAndLengthsNamingThem) {
  auto expect_header_error = [](const TcpHeader& h, const std::string& needle) {
    std::array<std::byte, kTcpHeaderBytes> raw;
    encode_tcp_header(h, raw.data());
    auto r = decode_tcp_header(raw.data());
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolError);
    EXPECT_TRUE(testing::contains(r.status().message(), needle)) << r.status().message();
  };
  expect_header_error(vector_header(TcpFrame::kWriteV, 0, 4096), "entry count 0");
  expect_header_error(vector_header(TcpFrame::kReadV, kTcpMaxVecEntries + 1, 1 << 20),
                      "entry count " + std::to_string(kTcpMaxVecEntries + 1));
  expect_header_error(vector_header(TcpFrame::kWriteV, ~0ull, 1 << 20),
                      "entry count " + std::to_string(~0ull));
  expect_header_error(vector_header(TcpFrame::kWriteV, 4, kTcpMaxFrameBytes + 1),
                      "exceeds the limit");
  expect_header_error(vector_header(TcpFrame::kReadV, 4, kTcpMaxFrameBytes + 1),
                      "exceeds the limit");
  expect_header_error(vector_header(TcpFrame::kWriteV, 8, 7), "carries 7 bytes");
  // The largest table is accepted.
  std::array<std::byte, kTcpHeaderBytes> raw;
  encode_tcp_header(vector_header(TcpFrame::kReadV, kTcpMaxVecEntries, kTcpMaxFrameBytes),
                    raw.data());
  auto ok = decode_tcp_header(raw.data());
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(tcp_table_bytes(*ok), kTcpMaxVecEntries * kTcpVecEntryBytes);
}

TEST(TcpWire, VectorTableRejectsBadEntriesNamingThem) {
  std::vector<TcpVecEntry> out;
  auto expect_table_error = [&](uint64_t total, std::vector<TcpVecEntry> entries,
                                const std::string& needle) {
    Status s =
        decode_table_of(vector_header(TcpFrame::kWriteV, entries.size(), total), entries, out);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.code(), StatusCode::kProtocolError);
    EXPECT_TRUE(testing::contains(s.message(), needle)) << s.message();
  };
  // A zero-length entry.
  expect_table_error(4096, {{0x1000, 4096}, {0x3000, 0}}, "entry 1 has length 0");
  // An entry longer than what the frame holds, and lengths whose sum overflows 64 bits.
  expect_table_error(8192, {{0x1000, 4096}, {0x3000, 8192}}, "entry 1 has length 8192");
  expect_table_error(8192, {{0x1000, 4096}, {0x3000, ~0ull}},
                     "entry 1 has length " + std::to_string(~0ull));
  expect_table_error(8192, {{0x1000, ~0ull - 4095}, {0x3000, 8192}},
                     "entry 0 has length " + std::to_string(~0ull - 4095));
  // Entries that add up to less than the header says.
  expect_table_error(8192, {{0x1000, 4096}, {0x3000, 2048}}, "add up to 6144");
  // An entry whose range wraps around the address space.
  expect_table_error(8192, {{~0ull - 100, 4096}, {0x3000, 4096}}, "entry 0 at");
  // A table with more entries than the caller has room for.
  std::vector<TcpVecEntry> small(1);
  std::vector<std::byte> table(2 * kTcpVecEntryBytes);
  Status s = decode_tcp_table(vector_header(TcpFrame::kWriteV, 2, 8192), table.data(), small);
  EXPECT_EQ(s.code(), StatusCode::kProtocolError);
}

}  // namespace
}  // namespace kvferry
