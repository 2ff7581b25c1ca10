// Hostile and malformed frames against a real engine's tcp data endpoint, sent by a raw
// client (raw_tcp_client.h). Every frame that does not parse, or comes out of order, closes
// the connection; the registered memory and the memory around it stay unchanged; and the
// engine goes on serving fresh connections. A write outside registered memory is refused
// with NotRegistered but keeps the connection (a stale descriptor fails one op, not the
// lane). With authentication on, nothing is written for a peer that cannot prove the secret.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/pattern.h"
#include "raw_tcp_client.h"
#include "test_support.h"
#include "transport/tcp/tcp_server_io.h"

namespace kvferry {
namespace {

using testing::must;
using testing::RawFrame;
using testing::RawTcpClient;

constexpr uint64_t kRegionBytes = 1ull << 20;
// Unregistered memory on both sides of the region: a refused write aimed there must not
// land either.
constexpr uint64_t kGuardBytes = 1ull << 20;
constexpr uint64_t kProbeBytes = 4096;
constexpr std::byte kHostileByte{0xEE};
constexpr uint64_t kPatternSeed = 7;

std::vector<std::byte> hostile_payload(uint64_t bytes) {
  return std::vector<std::byte>(bytes, kHostileByte);
}

TcpHeader write_header(uint64_t request_id, uint64_t addr, uint64_t length) {
  TcpHeader h;
  h.type = TcpFrame::kWrite;
  h.request_id = request_id;
  h.addr = addr;
  h.length = length;
  return h;
}

TcpHeader read_header(uint64_t request_id, uint64_t addr, uint64_t length) {
  TcpHeader h = write_header(request_id, addr, length);
  h.type = TcpFrame::kRead;
  return h;
}

// An engine whose registered region sits between two unregistered guard areas of one
// buffer, so "unchanged" covers the memory around the region too.
class HostileFrames : public ::testing::Test {
 protected:
  void SetUp() override { start_engine(std::nullopt); }

  void start_engine(std::optional<std::string> secret) {
    secret_ = std::move(secret);
    EngineOptions options;
    options.name = "hostile-target";
    options.secret = secret_;
    engine_ = must(TransferEngine::create(options));
    buffer_.resize(kGuardBytes + kRegionBytes + kGuardBytes);
    fill_pattern(buffer_, kPatternSeed);
    ASSERT_TRUE(engine_->register_memory(buffer_.data() + kGuardBytes, kRegionBytes).ok());
    tcp_endpoint_ = must(testing::fetch_tcp_endpoint(engine_->endpoint(), secret_));
  }

  uint64_t region() const { return reinterpret_cast<uint64_t>(buffer_.data() + kGuardBytes); }
  uint64_t region_end() const { return region() + kRegionBytes; }
  uint64_t memory_checksum() const { return checksum(buffer_); }

  // A connection past kHello (and kAuth when the engine wants it).
  RawTcpClient ready_connection() {
    RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
    EXPECT_TRUE(c.hello().ok());
    if (secret_) {
      c.send(c.auth_frame(*secret_, 1));
      RawFrame ack = must(c.read_frame());
      EXPECT_EQ(ack.header.type, TcpFrame::kAck);
      EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kOk));
    }
    return c;
  }

  // A valid write on `c` lands and is acknowledged OK; the buffer's pattern is restored
  // afterwards so checksums stay comparable.
  void expect_valid_write_lands(RawTcpClient& c, uint64_t request_id) {
    std::vector<std::byte> bytes(kProbeBytes);
    fill_pattern(bytes, request_id);
    const uint64_t offset = kRegionBytes / 2;
    c.send(write_header(request_id, region() + offset, kProbeBytes), bytes);
    RawFrame ack = must(c.read_frame());
    EXPECT_EQ(ack.header.type, TcpFrame::kAck);
    EXPECT_EQ(ack.header.request_id, request_id);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kOk));
    std::span<std::byte> landed(buffer_.data() + kGuardBytes + offset, kProbeBytes);
    EXPECT_FALSE(find_pattern_mismatch(landed, request_id)) << "a valid write did not land";
    fill_pattern(landed, kPatternSeed, kGuardBytes + offset);
  }

  // The engine still serves a fresh connection: a write lands and a read returns it.
  void expect_engine_still_serves() {
    RawTcpClient c = ready_connection();
    expect_valid_write_lands(c, 99);
    c.send(read_header(100, region(), kProbeBytes));
    RawFrame data = must(c.read_frame());
    EXPECT_EQ(data.header.type, TcpFrame::kReadData);
    EXPECT_EQ(data.header.status, static_cast<uint32_t>(StatusCode::kOk));
    EXPECT_FALSE(find_pattern_mismatch(data.payload, kPatternSeed, kGuardBytes));
  }

  std::optional<std::string> secret_;
  std::unique_ptr<TransferEngine> engine_;
  std::vector<std::byte> buffer_;
  Endpoint tcp_endpoint_;
};

// ---------------------------------------------------------------------------------------
// Frames that close the connection.

struct HostileCase {
  std::string name;
  bool hello_first;  // send kHello (and read kHelloAck) before the hostile bytes
  bool half_close;   // then stop sending (the receiver sees end of stream)
  std::vector<std::byte> (*bytes)(uint64_t region);
};

void PrintTo(const HostileCase& c, std::ostream* os) { *os << c.name; }

std::vector<std::byte> with_field(std::vector<std::byte> frame, size_t offset,
                                  std::span<const std::byte> value) {
  std::copy(value.begin(), value.end(), frame.begin() + static_cast<ptrdiff_t>(offset));
  return frame;
}

TcpHeader vector_header(TcpFrame type, uint64_t count, uint64_t length, uint64_t request_id = 1) {
  TcpHeader h;
  h.type = type;
  h.request_id = request_id;
  h.addr = count;
  h.length = length;
  return h;
}

// A vector frame: header, table, payload (for kWriteV).
std::vector<std::byte> vector_frame(const TcpHeader& h, std::span<const TcpVecEntry> entries,
                                    std::span<const std::byte> payload = {}) {
  std::vector<std::byte> frame = testing::encode_frame(h);
  const size_t at = frame.size();
  frame.resize(at + entries.size() * kTcpVecEntryBytes);
  encode_tcp_table(entries, frame.data() + at);
  frame.insert(frame.end(), payload.begin(), payload.end());
  return frame;
}

// The same with the header's count and length taken from the entries.
std::vector<std::byte> vector_frame(TcpFrame type, std::span<const TcpVecEntry> entries,
                                    uint64_t /*region*/, std::span<const std::byte> payload = {},
                                    uint64_t request_id = 1) {
  uint64_t total = 0;
  for (const TcpVecEntry& e : entries) total += e.length;
  return vector_frame(vector_header(type, entries.size(), total, request_id), entries, payload);
}

std::vector<std::byte> valid_write(uint64_t region) {
  return testing::encode_frame(write_header(1, region, kProbeBytes), hostile_payload(kProbeBytes));
}

std::vector<std::byte> garbage(uint64_t bytes) {
  std::vector<std::byte> out(bytes);
  fill_pattern(out, 0xBAD);
  return out;
}

const HostileCase kClosingCases[] = {
    {"WrongMagic", true, false,
     [](uint64_t region) {
       constexpr std::byte kHttp[] = {std::byte{'P'}, std::byte{'O'}, std::byte{'S'},
                                      std::byte{'T'}};
       return with_field(valid_write(region), 0, kHttp);
     }},
    {"UnsupportedVersion", true, false,
     [](uint64_t region) {
       constexpr std::byte kVersion1[] = {std::byte{1}, std::byte{0}};
       return with_field(valid_write(region), 4, kVersion1);
     }},
    {"VectorOfNoEntries", true, false,
     [](uint64_t region) {
       return vector_frame(TcpFrame::kWriteV, {}, region, hostile_payload(kProbeBytes));
     }},
    {"VectorOfTooManyEntries", true, false,
     [](uint64_t region) {
       std::vector<TcpVecEntry> entries(kTcpMaxVecEntries + 1, {region, 1});
       return vector_frame(TcpFrame::kReadV, entries, region);
     }},
    {"VectorEntriesShortOfTheLength", true, false,
     [](uint64_t region) {
       TcpHeader h = vector_header(TcpFrame::kWriteV, 2, 2 * kProbeBytes);
       std::vector<TcpVecEntry> entries = {{region, kProbeBytes}, {region + kProbeBytes, 1}};
       return vector_frame(h, entries, hostile_payload(2 * kProbeBytes));
     }},
    {"VectorEntryOfLengthZero", true, false,
     [](uint64_t region) {
       TcpHeader h = vector_header(TcpFrame::kReadV, 2, kProbeBytes);
       const std::vector<TcpVecEntry> entries = {{region, kProbeBytes}, {region, 0}};
       return vector_frame(h, entries);
     }},
    {"VectorEntryWrapsAround", true, true,
     [](uint64_t region) {
       constexpr uint64_t kNearTop = std::numeric_limits<uint64_t>::max() - kProbeBytes / 2;
       TcpHeader h = vector_header(TcpFrame::kWriteV, 2, 2 * kProbeBytes);
       const std::vector<TcpVecEntry> entries = {{region, kProbeBytes}, {kNearTop, kProbeBytes}};
       return vector_frame(h, entries, hostile_payload(2 * kProbeBytes));
     }},
    {"UnknownType", true, false,
     [](uint64_t region) {
       constexpr std::byte kType99[] = {std::byte{99}, std::byte{0}};
       return with_field(valid_write(region), 6, kType99);
     }},
    {"WriteLengthOverflow", true, false,
     [](uint64_t region) {
       auto frame = testing::encode_frame(write_header(1, region, kTcpMaxFrameBytes + 1));
       auto payload = hostile_payload(64 * 1024);
       frame.insert(frame.end(), payload.begin(), payload.end());
       return frame;
     }},
    {"WriteLengthOfAllMemory", true, false,
     [](uint64_t region) {
       return testing::encode_frame(write_header(1, region, std::numeric_limits<uint64_t>::max()),
                                    hostile_payload(kProbeBytes));
     }},
    {"ReadLengthOverflow", true, false,
     [](uint64_t region) {
       return testing::encode_frame(read_header(1, region, kTcpMaxFrameBytes + 1));
     }},
    {"WriteAddressWrapsAround", true, false,
     [](uint64_t) {
       constexpr uint64_t kNearTop = std::numeric_limits<uint64_t>::max() - kProbeBytes / 2;
       return testing::encode_frame(write_header(1, kNearTop, kProbeBytes),
                                    hostile_payload(kProbeBytes));
     }},
    {"ReadAddressWrapsAround", true, false,
     [](uint64_t) {
       constexpr uint64_t kNearTop = std::numeric_limits<uint64_t>::max() - kProbeBytes / 2;
       return testing::encode_frame(read_header(1, kNearTop, kProbeBytes));
     }},
    {"UnknownStatusCode", true, false,
     [](uint64_t region) {
       TcpHeader h = write_header(1, region, 0);
       h.status = 1000;
       return testing::encode_frame(h);
     }},
    {"TruncatedHeaderThenClose", true, true,
     [](uint64_t region) {
       auto frame = valid_write(region);
       frame.resize(kTcpHeaderBytes / 2);
       return frame;
     }},
    {"WriteBeforeHello", false, false, valid_write},
    {"ReadBeforeHello", false, false,
     [](uint64_t region) { return testing::encode_frame(read_header(1, region, kProbeBytes)); }},
    {"GarbageBeforeHello", false, false, [](uint64_t) { return garbage(4096); }},
    {"GarbageAfterHello", true, false, [](uint64_t) { return garbage(4096); }},
    {"SecondHello", true, false,
     [](uint64_t) {
       TcpHeader h;
       h.type = TcpFrame::kHello;
       return testing::encode_frame(h);
     }},
    {"AuthWhenNoneIsRequired", true, false,
     [](uint64_t) {
       TcpHeader h;
       h.type = TcpFrame::kAuth;
       h.length = kTcpProofBytes;
       return testing::encode_frame(h, hostile_payload(kTcpProofBytes));
     }},
    {"AckFromTheInitiator", true, false,
     [](uint64_t) {
       TcpHeader h;
       h.type = TcpFrame::kAck;
       return testing::encode_frame(h);
     }},
};

class HostileFrameCloses : public HostileFrames,
                           public ::testing::WithParamInterface<HostileCase> {};

TEST_P(HostileFrameCloses, ConnectionClosedMemoryUnchangedEngineStillServes) {
  const HostileCase& c = GetParam();
  const uint64_t before = memory_checksum();
  RawTcpClient client = must(RawTcpClient::connect(tcp_endpoint_));
  if (c.hello_first) {
    ASSERT_TRUE(client.hello().ok());
  }
  client.send(c.bytes(region()));
  if (c.half_close) client.half_close();
  std::string what;
  EXPECT_TRUE(client.closed_by_peer(what)) << what;
  EXPECT_EQ(memory_checksum(), before) << "a rejected frame changed memory";
  expect_engine_still_serves();
  EXPECT_EQ(memory_checksum(), before);
}

INSTANTIATE_TEST_SUITE_P(TcpHostile, HostileFrameCloses, ::testing::ValuesIn(kClosingCases),
                         [](const auto& test) { return test.param.name; });

// ---------------------------------------------------------------------------------------
// Targets outside registered memory: refused per op, the connection stays usable.

TEST_F(HostileFrames, WriteOutsideEveryRegionIsRefusedWithNotRegisteredAndKeepsTheConnection) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = ready_connection();
  struct Target {
    const char* what;
    uint64_t addr;
  };
  const Target targets[] = {
      {"just past the region", region_end()},
      {"straddling the region's end", region_end() - kProbeBytes / 2},
      {"straddling the region's start", region() - kProbeBytes / 2},
      {"just before the region", region() - kProbeBytes},
      {"the zero page", 0},
  };
  uint64_t id = 10;
  for (const Target& t : targets) {
    SCOPED_TRACE(t.what);
    c.send(write_header(++id, t.addr, kProbeBytes), hostile_payload(kProbeBytes));
    RawFrame ack = must(c.read_frame());
    EXPECT_EQ(ack.header.type, TcpFrame::kAck);
    EXPECT_EQ(ack.header.request_id, id);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kNotRegistered));
    EXPECT_EQ(memory_checksum(), before);
  }
  // A read outside is refused the same way: no bytes, NotRegistered.
  c.send(read_header(++id, region_end(), kProbeBytes));
  RawFrame data = must(c.read_frame());
  EXPECT_EQ(data.header.type, TcpFrame::kReadData);
  EXPECT_EQ(data.header.request_id, id);
  EXPECT_EQ(data.header.status, static_cast<uint32_t>(StatusCode::kNotRegistered));
  EXPECT_TRUE(data.payload.empty());
  // The same connection still carries a valid write.
  expect_valid_write_lands(c, ++id);
  EXPECT_EQ(memory_checksum(), before);
}

// A peer of another protocol version is told so at kHello and closed.
TEST_F(HostileFrames, HelloOfAnotherProtocolVersionIsRefusedLoudlyAndClosed) {
  RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
  TcpHeader h;
  h.type = TcpFrame::kHello;
  std::vector<std::byte> hello = testing::encode_frame(h);
  hello[4] = std::byte{1};  // version 1: before vector frames
  c.send(hello);
  RawFrame refusal = must(c.read_frame());
  EXPECT_EQ(refusal.header.type, TcpFrame::kAck);
  EXPECT_EQ(refusal.header.status, static_cast<uint32_t>(StatusCode::kProtocolError));
  std::string what;
  EXPECT_TRUE(c.closed_by_peer(what)) << what;
  expect_engine_still_serves();
}

// ---------------------------------------------------------------------------------------
// Vector frames: checked whole before any byte lands.

TEST_F(HostileFrames, VectorWriteWithOneEntryOutsideIsRefusedWholeAndNothingLands) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = ready_connection();
  uint64_t id = 20;
  const uint64_t outside_targets[] = {region_end(), region() - kProbeBytes / 2, 0};
  for (uint64_t outside : outside_targets) {
    SCOPED_TRACE(outside);
    // Seven good entries around one bad one: none of them may land.
    std::vector<TcpVecEntry> entries;
    for (uint64_t i = 0; i < 8; ++i)
      entries.push_back({region() + i * 2 * kProbeBytes, kProbeBytes});
    entries[5].addr = outside;
    c.send(vector_frame(TcpFrame::kWriteV, entries, region(),
                        hostile_payload(entries.size() * kProbeBytes), ++id));
    RawFrame ack = must(c.read_frame());
    EXPECT_EQ(ack.header.type, TcpFrame::kAck);
    EXPECT_EQ(ack.header.request_id, id);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kNotRegistered));
    EXPECT_EQ(ack.header.addr, outside) << "the refusal names the entry";
    EXPECT_EQ(memory_checksum(), before) << "a refused vector frame changed memory";
    // A kReadV with the same table: refused, no bytes, naming the entry.
    c.send(vector_frame(TcpFrame::kReadV, entries, region(), {}, ++id));
    RawFrame data = must(c.read_frame());
    EXPECT_EQ(data.header.type, TcpFrame::kReadData);
    EXPECT_EQ(data.header.request_id, id);
    EXPECT_EQ(data.header.status, static_cast<uint32_t>(StatusCode::kNotRegistered));
    EXPECT_EQ(data.header.addr, outside);
    EXPECT_TRUE(data.payload.empty());
  }
  // Past its deadline: refused with Timeout, nothing lands.
  std::vector<TcpVecEntry> good = {{region(), kProbeBytes}, {region() + 3 * kProbeBytes, 100}};
  TcpHeader late = vector_header(TcpFrame::kWriteV, 2, kProbeBytes + 100, ++id);
  late.deadline_ns = 1;
  c.send(vector_frame(late, good, hostile_payload(kProbeBytes + 100)));
  RawFrame ack = must(c.read_frame());
  EXPECT_EQ(ack.header.request_id, id);
  EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kTimeout));
  EXPECT_EQ(memory_checksum(), before);
  // The connection still carries a valid write.
  expect_valid_write_lands(c, ++id);
  EXPECT_EQ(memory_checksum(), before);
}

// A write whose deadline is nearer than the receiver's landing margin when it arrives could
// still be landing when its initiator reports Timeout: refused with Timeout, nothing lands,
// whether it would go through the input buffer (4 KiB) or straight into the region
// (256 KiB). The same writes with seconds to spare land. (This host's clock is the receiver's.)
TEST_F(HostileFrames, AWriteArrivingWithinTheLandingMarginOfItsDeadlineIsRefusedAndNothingLands) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = ready_connection();
  uint64_t id = 30;
  for (const uint64_t bytes : {kProbeBytes, kRegionBytes / 4}) {
    SCOPED_TRACE(bytes);
    TcpHeader near = write_header(++id, region(), bytes);
    near.deadline_ns = steady_ns(Clock::now()) + kLandingMarginNs / 2;
    c.send(near, hostile_payload(bytes));
    RawFrame ack = must(c.read_frame());
    EXPECT_EQ(ack.header.request_id, id);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kTimeout));
    EXPECT_EQ(memory_checksum(), before) << "a write within the landing margin landed";

    TcpHeader ample = write_header(++id, region(), bytes);
    ample.deadline_ns = steady_ns(Clock::now() + std::chrono::seconds(10));
    std::vector<std::byte> payload(bytes);
    fill_pattern(payload, id);
    c.send(ample, payload);
    ack = must(c.read_frame());
    EXPECT_EQ(ack.header.request_id, id);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kOk));
    std::span<std::byte> landed(buffer_.data() + kGuardBytes, bytes);
    EXPECT_FALSE(find_pattern_mismatch(landed, id)) << "a write with time to spare did not land";
    fill_pattern(landed, kPatternSeed, kGuardBytes);
  }
  EXPECT_EQ(memory_checksum(), before);
}

TEST_F(HostileFrames, VectorWriteAndReadMoveEveryEntry) {
  RawTcpClient c = ready_connection();
  // Entries of odd sizes at odd offsets, out of address order.
  const std::vector<TcpVecEntry> entries = {{region() + 70'001, 5000},
                                            {region() + 3, 1},
                                            {region() + 200'000, 20'000},
                                            {region() + 10'000, 4096}};
  uint64_t total = 0;
  for (const TcpVecEntry& e : entries) total += e.length;
  std::vector<std::byte> payload(total);
  fill_pattern(payload, 55);
  c.send(vector_frame(TcpFrame::kWriteV, entries, region(), payload, 7));
  RawFrame ack = must(c.read_frame());
  EXPECT_EQ(ack.header.type, TcpFrame::kAck);
  EXPECT_EQ(ack.header.request_id, 7u);
  EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kOk));
  uint64_t at = 0;
  for (const TcpVecEntry& e : entries) {
    const std::byte* landed = buffer_.data() + kGuardBytes + (e.addr - region());
    EXPECT_TRUE(std::equal(landed, landed + e.length, payload.begin() + static_cast<ptrdiff_t>(at)))
        << "entry at " << e.addr;
    at += e.length;
  }
  c.send(vector_frame(TcpFrame::kReadV, entries, region(), {}, 8));
  RawFrame data = must(c.read_frame());
  EXPECT_EQ(data.header.type, TcpFrame::kReadData);
  EXPECT_EQ(data.header.request_id, 8u);
  EXPECT_EQ(data.header.status, static_cast<uint32_t>(StatusCode::kOk));
  EXPECT_TRUE(data.payload == payload);
}

// ---------------------------------------------------------------------------------------
// Authentication on.

constexpr char kSecret[] = "correct horse battery staple";

class HostileFramesWithAuth : public HostileFrames {
 protected:
  void SetUp() override { start_engine(kSecret); }

  // After a refusal the receiver acknowledges with Unauthenticated and hangs up.
  void expect_refused(RawTcpClient& c, uint64_t before) {
    RawFrame ack = must(c.read_frame());
    EXPECT_EQ(ack.header.type, TcpFrame::kAck);
    EXPECT_EQ(ack.header.status, static_cast<uint32_t>(StatusCode::kUnauthenticated));
    std::string what;
    EXPECT_TRUE(c.closed_by_peer(what)) << what;
    EXPECT_EQ(memory_checksum(), before) << "an unauthenticated peer changed memory";
    expect_engine_still_serves();
  }
};

TEST_F(HostileFramesWithAuth, PeerProvingTheSecretCanWrite) {
  RawTcpClient c = ready_connection();
  EXPECT_EQ(c.nonce().size(), kTcpNonceBytes);
  expect_valid_write_lands(c, 5);
}

TEST_F(HostileFramesWithAuth, WriteWithoutAuthIsRefusedWithUnauthenticated) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(c.hello().ok());
  c.send(write_header(5, region(), kProbeBytes), hostile_payload(kProbeBytes));
  expect_refused(c, before);
}

TEST_F(HostileFramesWithAuth, WrongProofIsRefusedAndWritesPipelinedAfterItAreNotApplied) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(c.hello().ok());
  std::vector<std::byte> bytes = c.auth_frame("wrong secret", 1);
  auto write =
      testing::encode_frame(write_header(2, region(), kProbeBytes), hostile_payload(kProbeBytes));
  bytes.insert(bytes.end(), write.begin(), write.end());
  c.send(bytes);
  expect_refused(c, before);
}

TEST_F(HostileFramesWithAuth, RefusedConnectionCannotRetryAuthBeforeItCloses) {
  // A refused connection is finished: a second kAuth pipelined behind a failed one must
  // not authenticate it (else one connection could try proofs until the refusal flushes).
  const uint64_t before = memory_checksum();
  RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(c.hello().ok());
  std::vector<std::byte> bytes = c.auth_frame("wrong secret", 1);
  auto retry = c.auth_frame(kSecret, 2);
  auto write =
      testing::encode_frame(write_header(3, region(), kProbeBytes), hostile_payload(kProbeBytes));
  bytes.insert(bytes.end(), retry.begin(), retry.end());
  bytes.insert(bytes.end(), write.begin(), write.end());
  c.send(bytes);
  expect_refused(c, before);
}

TEST_F(HostileFramesWithAuth, ProofOfTheWrongLengthIsRefused) {
  const uint64_t before = memory_checksum();
  RawTcpClient c = must(RawTcpClient::connect(tcp_endpoint_));
  ASSERT_TRUE(c.hello().ok());
  TcpHeader h;
  h.type = TcpFrame::kAuth;
  h.length = kTcpProofBytes / 2;
  c.send(h, hostile_payload(kTcpProofBytes / 2));
  expect_refused(c, before);
}

}  // namespace
}  // namespace kvferry
