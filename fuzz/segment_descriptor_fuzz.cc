// libFuzzer target: parse_segment_descriptor must return a Status, never crash, on any
// bytes; a descriptor it accepts must keep the invariants it promises (regions sorted,
// non-empty, non-overlapping, no wraparound), and serializing it and parsing that again must
// give an equal descriptor.
// Build and run: scripts/fuzz.sh (or cmake -DKVFERRY_FUZZ=ON with clang; see CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "metadata/segment_descriptor.h"

namespace {

using kvferry::RegionDescriptor;
using kvferry::SegmentDescriptor;

bool same_region(const RegionDescriptor& a, const RegionDescriptor& b) {
  if (a.addr != b.addr || a.length != b.length || a.location.kind != b.location.kind ||
      a.location.device != b.location.device || a.shm.has_value() != b.shm.has_value()) {
    return false;
  }
  return !a.shm || (a.shm->fd == b.shm->fd && a.shm->file_offset == b.shm->file_offset &&
                    a.shm->file_bytes == b.shm->file_bytes && a.shm->inode == b.shm->inode);
}

bool same_descriptor(const SegmentDescriptor& a, const SegmentDescriptor& b) {
  if (a.name != b.name || a.endpoint != b.endpoint || a.tcp_endpoint != b.tcp_endpoint ||
      a.incarnation != b.incarnation || a.host_id != b.host_id || a.pid != b.pid ||
      a.transports != b.transports || a.version != b.version ||
      a.regions.size() != b.regions.size()) {
    return false;
  }
  for (size_t i = 0; i < a.regions.size(); ++i) {
    if (!same_region(a.regions[i], b.regions[i])) return false;
  }
  return true;
}

bool keeps_its_promises(const SegmentDescriptor& d) {
  if (d.regions.size() > kvferry::kMaxDescriptorRegions) return false;
  for (size_t i = 0; i < d.regions.size(); ++i) {
    const RegionDescriptor& r = d.regions[i];
    if (r.length == 0 || r.addr + r.length < r.addr) return false;
    if (i > 0 && d.regions[i - 1].addr + d.regions[i - 1].length > r.addr) return false;
    if (r.shm && (r.shm->file_offset > r.shm->file_bytes ||
                  r.length > r.shm->file_bytes - r.shm->file_offset)) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto descriptor = kvferry::parse_segment_descriptor(text);
  if (!descriptor.ok()) {
    if (descriptor.status().code() != kvferry::StatusCode::kProtocolError) std::abort();
    return 0;
  }
  if (!keeps_its_promises(*descriptor)) std::abort();
  const std::string json = kvferry::serialize_segment_descriptor(*descriptor);
  auto reparsed = kvferry::parse_segment_descriptor(json);
  if (!reparsed.ok() || !same_descriptor(*reparsed, *descriptor)) std::abort();
  if (kvferry::serialize_segment_descriptor(*reparsed) != json) std::abort();
  return 0;
}
