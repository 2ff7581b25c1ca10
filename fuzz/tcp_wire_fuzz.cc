// libFuzzer target: decode_tcp_header must return a Status, never crash, on any 48 bytes;
// whatever it accepts must satisfy the checks it promises (known type, payload within
// kTcpMaxFrameBytes, no address wraparound, known status code; for a vector frame an entry
// count within 1..kTcpMaxVecEntries), and re-encoding it must give back the same frame. For a
// vector frame the bytes after the header are its table: decode_tcp_table must accept only
// entries of at least one byte, without wraparound, adding up to the header's length, and
// re-encode them to the same bytes.
// Build and run: scripts/fuzz.sh (or cmake -DKVFERRY_FUZZ=ON with clang; see CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/tcp/tcp_wire.h"

namespace {

// The last four header bytes are reserved: sent as zero, ignored by the decoder.
constexpr size_t kReservedOffset = kvferry::kTcpHeaderBytes - 4;

bool same_header(const kvferry::TcpHeader& a, const kvferry::TcpHeader& b) {
  return a.type == b.type && a.request_id == b.request_id && a.addr == b.addr &&
         a.length == b.length && a.deadline_ns == b.deadline_ns && a.status == b.status;
}

bool keeps_its_promises(const kvferry::TcpHeader& h) {
  using kvferry::TcpFrame;
  const auto type = static_cast<uint16_t>(h.type);
  if (type < static_cast<uint16_t>(TcpFrame::kHello) ||
      type > static_cast<uint16_t>(TcpFrame::kReadV)) {
    return false;
  }
  const bool sized = kvferry::tcp_frame_has_payload(h.type) || h.type == TcpFrame::kRead ||
                     h.type == TcpFrame::kReadV;
  if (sized && h.length > kvferry::kTcpMaxFrameBytes) return false;
  if (!kvferry::is_valid_status_code(h.status)) return false;
  if (kvferry::tcp_frame_is_vector(h.type)) {
    return h.addr >= 1 && h.addr <= kvferry::kTcpMaxVecEntries && h.length >= h.addr;
  }
  return h.addr + h.length >= h.addr;
}

// A vector frame's table: what decode_tcp_table accepts keeps its promises and round-trips.
void check_table(const kvferry::TcpHeader& h, const std::byte* table) {
  std::vector<kvferry::TcpVecEntry> entries(h.addr);
  kvferry::Status s = kvferry::decode_tcp_table(h, table, entries);
  if (!s.ok()) {
    if (s.code() != kvferry::StatusCode::kProtocolError) std::abort();
    return;
  }
  uint64_t total = 0;
  for (const kvferry::TcpVecEntry& e : entries) {
    if (e.length == 0 || e.addr + e.length < e.addr) std::abort();
    if (e.length > h.length - total) std::abort();
    total += e.length;
  }
  if (total != h.length) std::abort();
  std::vector<std::byte> again(kvferry::tcp_table_bytes(h));
  kvferry::encode_tcp_table(entries, again.data());
  if (std::memcmp(again.data(), table, again.size()) != 0) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // One header, and for a vector frame its table after it.
  if (size < kvferry::kTcpHeaderBytes) return -1;
  const auto* in = reinterpret_cast<const std::byte*>(data);
  auto header = kvferry::decode_tcp_header(in);
  if (!header.ok()) {
    if (header.status().code() != kvferry::StatusCode::kProtocolError) std::abort();
    return 0;
  }
  if (!keeps_its_promises(*header)) std::abort();
  std::byte again[kvferry::kTcpHeaderBytes];
  kvferry::encode_tcp_header(*header, again);
  if (std::memcmp(again, in, kReservedOffset) != 0) std::abort();
  auto reread = kvferry::decode_tcp_header(again);
  if (!reread.ok() || !same_header(*reread, *header)) std::abort();
  if (kvferry::tcp_frame_is_vector(header->type) &&
      size - kvferry::kTcpHeaderBytes >= kvferry::tcp_table_bytes(*header)) {
    check_table(*header, in + kvferry::kTcpHeaderBytes);
  }
  return 0;
}
