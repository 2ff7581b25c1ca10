#include "metadata/segment_descriptor.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>

#include "core/json_excerpt.h"

namespace kvferry {
namespace {

constexpr int kDescriptorFormat = 1;
using json = nlohmann::json;

Status bad(std::string_view what) {
  return ProtocolError("malformed segment descriptor: " + std::string(what));
}

template <typename T>
Result<T> get_field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return bad(std::string("missing field '") + key + "'");
  if constexpr (std::is_same_v<T, std::string>) {
    if (!it->is_string()) return bad(std::string("field '") + key + "' is not a string");
  } else if constexpr (std::is_unsigned_v<T>) {
    if (!it->is_number_unsigned()) {
      return bad(std::string("field '") + key +
                 "' is not a non-negative integer: " + json_excerpt(*it));
    }
  } else {
    // An unsigned value above the signed range would wrap to a negative one (2^64-1 -> -1).
    if (!it->is_number_integer() ||
        (it->is_number_unsigned() &&
         it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<T>::max()))) {
      return bad(std::string("field '") + key + "' is not a " + std::to_string(sizeof(T) * 8) +
                 "-bit signed integer: " + json_excerpt(*it));
    }
  }
  return it->get<T>();
}

constexpr char kHexDigits[] = "0123456789abcdef";

std::string to_hex(std::span<const uint8_t> bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kHexDigits[b >> 4]);
    out.push_back(kHexDigits[b & 0xf]);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is refused: one spelling per handle
}

Result<CudaIpcBacking> parse_cuda(const json& c, const RegionDescriptor& region) {
  if (!c.is_object()) return bad("'cuda' is not an object");
  if (region.location.kind != MemoryLocation::Kind::kCuda) {
    return bad("region at " + std::to_string(region.addr) + " has a 'cuda' object but device -1");
  }
  CudaIpcBacking cuda;
  KVF_ASSIGN_OR_RETURN(std::string handle, get_field<std::string>(c, "ipc_handle"));
  if (handle.size() != 2 * kCudaIpcHandleBytes) {
    return bad("cuda ipc_handle has " + std::to_string(handle.size()) + " hex digits, not " +
               std::to_string(2 * kCudaIpcHandleBytes));
  }
  for (size_t i = 0; i < kCudaIpcHandleBytes; ++i) {
    int hi = hex_value(handle[2 * i]);
    int lo = hex_value(handle[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad("cuda ipc_handle is not lower-case hex");
    cuda.handle[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  KVF_ASSIGN_OR_RETURN(cuda.allocation_offset, get_field<uint64_t>(c, "offset"));
  KVF_ASSIGN_OR_RETURN(cuda.allocation_bytes, get_field<uint64_t>(c, "allocation_bytes"));
  if (cuda.allocation_bytes > kMaxCudaAllocationBytes) {
    return bad("cuda allocation_bytes " + std::to_string(cuda.allocation_bytes) +
               " exceeds the limit of " + std::to_string(kMaxCudaAllocationBytes));
  }
  if (cuda.allocation_offset > cuda.allocation_bytes ||
      region.length > cuda.allocation_bytes - cuda.allocation_offset) {
    return bad("cuda range of region at " + std::to_string(region.addr) +
               " runs past its allocation (" + std::to_string(cuda.allocation_bytes) + " bytes)");
  }
  return cuda;
}

Result<RegionDescriptor> parse_region(const json& r) {
  if (!r.is_object()) return bad("region is not an object");
  RegionDescriptor region;
  KVF_ASSIGN_OR_RETURN(region.addr, get_field<uint64_t>(r, "addr"));
  KVF_ASSIGN_OR_RETURN(region.length, get_field<uint64_t>(r, "length"));
  if (region.length == 0) return bad("region at " + std::to_string(region.addr) + " has length 0");
  if (region.addr + region.length < region.addr) {
    return bad("region at " + std::to_string(region.addr) + " wraps around the address space");
  }
  KVF_ASSIGN_OR_RETURN(int64_t device, get_field<int64_t>(r, "device"));
  if (device < -1 || device > 1024)
    return bad("device " + std::to_string(device) + " out of range");
  region.location.device = static_cast<int>(device);
  region.location.kind = device < 0 ? MemoryLocation::Kind::kHost : MemoryLocation::Kind::kCuda;
  if (auto it = r.find("shm"); it != r.end()) {
    if (!it->is_object()) return bad("'shm' is not an object");
    ShmBacking shm;
    KVF_ASSIGN_OR_RETURN(int64_t fd, get_field<int64_t>(*it, "fd"));
    if (fd < 0 || fd > (1 << 24)) return bad("shm fd " + std::to_string(fd) + " out of range");
    shm.fd = static_cast<int>(fd);
    KVF_ASSIGN_OR_RETURN(shm.file_offset, get_field<uint64_t>(*it, "offset"));
    KVF_ASSIGN_OR_RETURN(shm.file_bytes, get_field<uint64_t>(*it, "file_bytes"));
    KVF_ASSIGN_OR_RETURN(shm.inode, get_field<uint64_t>(*it, "inode"));
    if (shm.file_offset > shm.file_bytes || region.length > shm.file_bytes - shm.file_offset) {
      return bad("shm range of region at " + std::to_string(region.addr) + " runs past its file (" +
                 std::to_string(shm.file_bytes) + " bytes)");
    }
    region.shm = shm;
  }
  if (auto it = r.find("cuda"); it != r.end()) {
    KVF_ASSIGN_OR_RETURN(region.cuda, parse_cuda(*it, region));
  }
  return region;
}

}  // namespace

std::string serialize_segment_descriptor(const SegmentDescriptor& d) {
  json regions = json::array();
  for (const RegionDescriptor& r : d.regions) {
    json region = {{"addr", r.addr}, {"length", r.length}, {"device", r.location.device}};
    if (r.location.kind == MemoryLocation::Kind::kHost) region["device"] = -1;
    if (r.shm) {
      region["shm"] = {{"fd", r.shm->fd},
                       {"offset", r.shm->file_offset},
                       {"file_bytes", r.shm->file_bytes},
                       {"inode", r.shm->inode}};
    }
    if (r.cuda && r.location.kind == MemoryLocation::Kind::kCuda) {
      region["cuda"] = {{"ipc_handle", to_hex(r.cuda->handle)},
                        {"offset", r.cuda->allocation_offset},
                        {"allocation_bytes", r.cuda->allocation_bytes}};
    }
    regions.push_back(std::move(region));
  }
  json transports = json::array();
  for (TransportKind kind : kAllTransportKinds) {
    if (d.transports.contains(kind)) transports.push_back(transport_kind_name(kind));
  }
  json out = {{"format", kDescriptorFormat},  {"name", d.name},       {"endpoint", d.endpoint},
              {"incarnation", d.incarnation}, {"host_id", d.host_id}, {"pid", d.pid},
              {"transports", transports},     {"version", d.version}, {"regions", regions}};
  if (!d.tcp_endpoint.empty()) out["tcp_endpoint"] = d.tcp_endpoint;
  return out.dump();
}

Result<SegmentDescriptor> parse_segment_descriptor(std::string_view text) {
  if (text.size() > kMaxDescriptorBytes) {
    return bad("size " + std::to_string(text.size()) + " exceeds the limit of " +
               std::to_string(kMaxDescriptorBytes) + " bytes");
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object()) return bad("top level is not an object");
  KVF_ASSIGN_OR_RETURN(int64_t format, get_field<int64_t>(doc, "format"));
  if (format != kDescriptorFormat) {
    return bad("unsupported format " + std::to_string(format) + " (this build reads " +
               std::to_string(kDescriptorFormat) + ")");
  }
  SegmentDescriptor d;
  KVF_ASSIGN_OR_RETURN(d.name, get_field<std::string>(doc, "name"));
  KVF_ASSIGN_OR_RETURN(d.endpoint, get_field<std::string>(doc, "endpoint"));
  KVF_ASSIGN_OR_RETURN(d.incarnation, get_field<uint64_t>(doc, "incarnation"));
  KVF_ASSIGN_OR_RETURN(d.host_id, get_field<std::string>(doc, "host_id"));
  KVF_ASSIGN_OR_RETURN(d.pid, get_field<int64_t>(doc, "pid"));
  KVF_ASSIGN_OR_RETURN(d.version, get_field<uint64_t>(doc, "version"));
  if (auto tcp = doc.find("tcp_endpoint"); tcp != doc.end()) {
    if (!tcp->is_string()) return bad("field 'tcp_endpoint' is not a string");
    d.tcp_endpoint = tcp->get<std::string>();
  }
  auto transports = doc.find("transports");
  if (transports == doc.end() || !transports->is_array())
    return bad("'transports' is not an array");
  for (const json& t : *transports) {
    if (!t.is_string()) return bad("transport name is not a string");
    // Unknown names (from a newer peer) are skipped: we cannot use what we do not know.
    auto kind = parse_transport_kind(t.get<std::string>());
    if (kind.ok()) d.transports.insert(*kind);
  }
  auto regions = doc.find("regions");
  if (regions == doc.end() || !regions->is_array()) return bad("'regions' is not an array");
  if (regions->size() > kMaxDescriptorRegions) {
    return bad(std::to_string(regions->size()) + " regions exceed the limit of " +
               std::to_string(kMaxDescriptorRegions));
  }
  d.regions.reserve(regions->size());
  for (const json& r : *regions) {
    KVF_ASSIGN_OR_RETURN(RegionDescriptor region, parse_region(r));
    d.regions.push_back(region);
  }
  std::sort(d.regions.begin(), d.regions.end(),
            [](const RegionDescriptor& a, const RegionDescriptor& b) { return a.addr < b.addr; });
  for (size_t i = 1; i < d.regions.size(); ++i) {
    if (d.regions[i - 1].addr + d.regions[i - 1].length > d.regions[i].addr) {
      return bad("regions at " + std::to_string(d.regions[i - 1].addr) + " and " +
                 std::to_string(d.regions[i].addr) + " overlap");
    }
  }
  return d;
}

bool advertises(const SegmentDescriptor& descriptor, MemoryKind kind) {
  return std::any_of(descriptor.regions.begin(), descriptor.regions.end(),
                     [kind](const RegionDescriptor& r) { return r.kind() == kind; });
}

}  // namespace kvferry
