// libFuzzer target: decode_tcp_header must return a Status, never crash, on any 48 bytes;
// whatever it accepts must satisfy the checks it promises (known type, payload within
// kTcpMaxFrameBytes, no address wraparound, known status code), and re-encoding it must give
// back the same frame.
// Build and run: scripts/fuzz.sh (or cmake -DKVFERRY_FUZZ=ON with clang; see CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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
      type > static_cast<uint16_t>(TcpFrame::kReadData)) {
    return false;
  }
  const bool sized = kvferry::tcp_frame_has_payload(h.type) || h.type == TcpFrame::kRead;
  if (sized && h.length > kvferry::kTcpMaxFrameBytes) return false;
  if (!kvferry::is_valid_status_code(h.status)) return false;
  return h.addr + h.length >= h.addr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size != kvferry::kTcpHeaderBytes) return -1;  // the receiver reads exactly one header
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
  return 0;
}
