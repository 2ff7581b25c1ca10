// libFuzzer target: decode_control_message must return a Status, never crash, on any bytes,
// and whatever it accepts must re-encode to the same frame.
// Build and run: scripts/fuzz.sh (or cmake -DKVFERRY_FUZZ=ON with clang; see CMakeLists.txt).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "kvferry/pd/control_message.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto message = kvferry::pd::decode_control_message(bytes);
  if (!message.ok()) {
    if (message.status().code() != kvferry::StatusCode::kProtocolError) std::abort();
    return 0;
  }
  std::vector<std::byte> again = kvferry::pd::encode_control_message(*message);
  if (again.size() != size || !std::equal(again.begin(), again.end(), bytes.begin())) {
    std::abort();  // a frame that decodes must round-trip exactly
  }
  return 0;
}
