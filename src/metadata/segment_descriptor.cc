#include "metadata/segment_descriptor.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

#include "core/json_fields.h"

namespace kvferry {
namespace {

// 2: shm backings carry a guard word (guard_offset, guard_slot, generation).
constexpr int kDescriptorFormat = 3;  // 3: cma_socket
using json = nlohmann::json;

Status bad(std::string_view what) {
  return ProtocolError("malformed segment descriptor: " + std::string(what));
}

const JsonErrors kErrors{StatusCode::kProtocolError, "malformed segment descriptor"};

JsonErrors backing_errors(const std::string& what) {
  return {StatusCode::kProtocolError, kErrors.context + ": " + what};
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

// Lower-case hex of at most max_bytes bytes, decoded; `what` names the field.
Result<std::string> parse_hex_bytes(const std::string& hex, size_t max_bytes,
                                    const std::string& what) {
  if (hex.empty() || hex.size() % 2 != 0) {
    return bad(what + " has " + std::to_string(hex.size()) + " hex digits (must be even, > 0)");
  }
  if (hex.size() / 2 > max_bytes) {
    return bad(what + " of " + std::to_string(hex.size() / 2) + " bytes exceeds the limit of " +
               std::to_string(max_bytes));
  }
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = hex_value(hex[2 * i]);
    int lo = hex_value(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad(what + " is not lower-case hex");
    out[i] = static_cast<char>(hi << 4 | lo);
  }
  return out;
}

std::string bytes_to_hex(const std::string& bytes) {
  return to_hex({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
}

Result<UcxEndpoint> parse_ucx(JsonFields u) {
  UcxEndpoint ucx;
  KVF_ASSIGN_OR_RETURN(std::string address, u.required<std::string>("worker_address"));
  KVF_ASSIGN_OR_RETURN(ucx.worker_address,
                       parse_hex_bytes(address, kMaxUcxWorkerAddressBytes, "ucx worker_address"));
  KVF_RETURN_IF_ERROR(u.required("hardware_rma", ucx.hardware_rma));
  KVF_RETURN_IF_ERROR(u.finish());
  return ucx;
}

Result<CudaIpcBacking> parse_cuda(JsonFields c, const RegionDescriptor& region) {
  if (region.location.kind != MemoryLocation::Kind::kCuda) {
    return bad("region at " + std::to_string(region.addr) + " has a 'cuda' object but device -1");
  }
  CudaIpcBacking cuda;
  KVF_ASSIGN_OR_RETURN(std::string handle, c.required<std::string>("ipc_handle"));
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
  KVF_RETURN_IF_ERROR(c.required("offset", cuda.allocation_offset));
  KVF_RETURN_IF_ERROR(c.required("allocation_bytes", cuda.allocation_bytes));
  KVF_RETURN_IF_ERROR(c.finish());
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

Result<ShmBacking> parse_shm(JsonFields f, const RegionDescriptor& region) {
  ShmBacking shm;
  KVF_ASSIGN_OR_RETURN(int64_t fd, f.required<int64_t>("fd"));
  if (fd < 0 || fd > (1 << 24)) return bad("shm fd " + std::to_string(fd) + " out of range");
  shm.fd = static_cast<int>(fd);
  KVF_RETURN_IF_ERROR(f.required("offset", shm.file_offset));
  KVF_RETURN_IF_ERROR(f.required("file_bytes", shm.file_bytes));
  KVF_RETURN_IF_ERROR(f.required("inode", shm.inode));
  KVF_RETURN_IF_ERROR(f.required("guard_offset", shm.guard_offset));
  KVF_ASSIGN_OR_RETURN(int64_t slot, f.required<int64_t>("guard_slot"));
  KVF_RETURN_IF_ERROR(f.required("generation", shm.generation));
  KVF_RETURN_IF_ERROR(f.finish());
  if (shm.file_offset > shm.file_bytes || region.length > shm.file_bytes - shm.file_offset) {
    return bad("shm range of region at " + std::to_string(region.addr) + " runs past its file (" +
               std::to_string(shm.file_bytes) + " bytes)");
  }
  // The guard word lies inside the file, 8-aligned, after the region (never inside it: a
  // copy into the region must not be able to forge its own guard).
  constexpr uint64_t kWord = sizeof(uint64_t);
  if (slot < 0 || slot >= (int64_t{1} << 20)) {
    return bad("shm guard_slot " + std::to_string(slot) + " of region at " +
               std::to_string(region.addr) + " out of range");
  }
  shm.guard_slot = static_cast<uint32_t>(slot);
  const uint64_t word = shm.guard_offset + kWord * shm.guard_slot;
  if (shm.guard_offset % kWord != 0 || word < shm.guard_offset || word > shm.file_bytes ||
      shm.file_bytes - word < kWord || shm.guard_offset < shm.file_offset + region.length) {
    return bad("shm guard word of region at " + std::to_string(region.addr) + " (offset " +
               std::to_string(shm.guard_offset) + ", slot " + std::to_string(shm.guard_slot) +
               ") is not an aligned word of its file after the region");
  }
  if (shm.generation == 0) {
    return bad("shm generation of region at " + std::to_string(region.addr) + " is 0");
  }
  return shm;
}

Result<RegionDescriptor> parse_region(const json& value) {
  KVF_ASSIGN_OR_RETURN(JsonFields r, JsonFields::of(value, "region", kErrors));
  RegionDescriptor region;
  KVF_RETURN_IF_ERROR(r.required("addr", region.addr));
  KVF_RETURN_IF_ERROR(r.required("length", region.length));
  if (region.length == 0) return bad("region at " + std::to_string(region.addr) + " has length 0");
  if (region.addr + region.length < region.addr) {
    return bad("region at " + std::to_string(region.addr) + " wraps around the address space");
  }
  KVF_ASSIGN_OR_RETURN(int64_t device, r.required<int64_t>("device"));
  if (device < -1 || device > 1024)
    return bad("device " + std::to_string(device) + " out of range");
  region.location.device = static_cast<int>(device);
  region.location.kind = device < 0 ? MemoryLocation::Kind::kHost : MemoryLocation::Kind::kCuda;
  // The backing objects' fields are named as they are ("offset"), with the object and its
  // region in the message's context.
  const std::string where = " of region at " + std::to_string(region.addr);
  if (const json* shm = r.optional_value("shm")) {
    KVF_ASSIGN_OR_RETURN(JsonFields f,
                         JsonFields::of(*shm, "'shm'", backing_errors("shm" + where)));
    KVF_ASSIGN_OR_RETURN(region.shm, parse_shm(std::move(f), region));
  }
  if (const json* cuda = r.optional_value("cuda")) {
    KVF_ASSIGN_OR_RETURN(JsonFields f,
                         JsonFields::of(*cuda, "'cuda'", backing_errors("cuda" + where)));
    KVF_ASSIGN_OR_RETURN(region.cuda, parse_cuda(std::move(f), region));
  }
  if (const json* rkey = r.optional_value("ucx_rkey")) {
    if (!rkey->is_string()) return bad("ucx_rkey" + where + " is not a string");
    KVF_ASSIGN_OR_RETURN(region.ucx_rkey, parse_hex_bytes(rkey->get<std::string>(),
                                                          kMaxUcxRkeyBytes, "ucx_rkey" + where));
  }
  KVF_RETURN_IF_ERROR(r.finish());
  return region;
}

}  // namespace

// A region as the JSON library writes it (keys sorted, no spaces), written directly: built
// as a document first, the regions of a 100,000-region engine took a third of registering
// them (a map node per key, a string per number).
void append_region_json(std::string& out, const RegionDescriptor& r) {
  // `key` (with its punctuation) then `value`, through to_chars: a format string parsed per
  // field cost more than the rest of the region.
  auto put = [&out](std::string_view key, auto value) {
    out.append(key);
    std::array<char, 24> digits{};
    out.append(digits.data(),
               std::to_chars(digits.data(), digits.data() + digits.size(), value).ptr);
  };
  put(R"({"addr":)", r.addr);
  if (r.cuda && r.location.kind == MemoryLocation::Kind::kCuda) {
    put(R"(,"cuda":{"allocation_bytes":)", r.cuda->allocation_bytes);
    out.append(R"(,"ipc_handle":")").append(to_hex(r.cuda->handle));
    put(R"(","offset":)", r.cuda->allocation_offset);
    out.push_back('}');
  }
  put(R"(,"device":)", r.location.kind == MemoryLocation::Kind::kHost ? -1 : r.location.device);
  put(R"(,"length":)", r.length);
  if (r.shm) {
    put(R"(,"shm":{"fd":)", r.shm->fd);
    put(R"(,"file_bytes":)", r.shm->file_bytes);
    put(R"(,"generation":)", r.shm->generation);
    put(R"(,"guard_offset":)", r.shm->guard_offset);
    put(R"(,"guard_slot":)", r.shm->guard_slot);
    put(R"(,"inode":)", r.shm->inode);
    put(R"(,"offset":)", r.shm->file_offset);
    out.push_back('}');
  }
  if (!r.ucx_rkey.empty()) {
    out.append(R"(,"ucx_rkey":")").append(bytes_to_hex(r.ucx_rkey)).push_back('"');
  }
  out.push_back('}');
}

std::string serialize_segment_descriptor(const SegmentDescriptor& d) {
  std::string regions = "[";
  for (const RegionDescriptor& r : d.regions) {
    if (regions.size() != 1) regions.push_back(',');
    append_region_json(regions, r);
  }
  regions.push_back(']');
  return serialize_segment_descriptor(d, regions);
}

std::string serialize_segment_descriptor(const SegmentDescriptor& d,
                                         std::string_view regions_json) {
  json transports = json::array();
  for (TransportKind kind : kAllTransportKinds) {
    if (d.transports.contains(kind)) transports.push_back(transport_kind_name(kind));
  }
  json out = {{"format", kDescriptorFormat},  {"name", d.name},       {"endpoint", d.endpoint},
              {"incarnation", d.incarnation}, {"host_id", d.host_id}, {"pid", d.pid},
              {"transports", transports},     {"version", d.version}, {"regions", json::array()}};
  if (!d.tcp_endpoint.empty()) out["tcp_endpoint"] = d.tcp_endpoint;
  if (!d.shm_socket.empty()) out["shm_socket"] = d.shm_socket;
  if (!d.cma_socket.empty()) out["cma_socket"] = d.cma_socket;
  if (!d.notify_endpoint.empty()) out["notify_endpoint"] = d.notify_endpoint;
  if (d.ucx) {
    out["ucx"] = {{"worker_address", bytes_to_hex(d.ucx->worker_address)},
                  {"hardware_rma", d.ucx->hardware_rma}};
  }
  // The regions go where the library put the empty array. Its first occurrence is the key's:
  // a string value before it has its quotes escaped.
  const std::string head = out.dump();
  constexpr std::string_view kKey = R"("regions":)";
  const size_t at = head.find(std::string(kKey) + "[]") + kKey.size();
  std::string text;
  text.reserve(head.size() + regions_json.size());
  text.append(head, 0, at);
  text.append(regions_json);
  text.append(head, at + 2);
  return text;
}

Result<SegmentDescriptor> parse_segment_descriptor(std::string_view text) {
  if (text.size() > kMaxDescriptorBytes) {
    return bad("size " + std::to_string(text.size()) + " exceeds the limit of " +
               std::to_string(kMaxDescriptorBytes) + " bytes");
  }
  json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return bad("not valid JSON");
  if (!doc.is_object()) return bad("top level is not an object");
  KVF_ASSIGN_OR_RETURN(JsonFields f, JsonFields::of(doc, "descriptor", kErrors));
  KVF_ASSIGN_OR_RETURN(int64_t format, f.required<int64_t>("format"));
  if (format != kDescriptorFormat) {
    return bad("unsupported format " + std::to_string(format) + " (this build reads " +
               std::to_string(kDescriptorFormat) + ")");
  }
  SegmentDescriptor d;
  KVF_RETURN_IF_ERROR(f.required("name", d.name));
  KVF_RETURN_IF_ERROR(f.required("endpoint", d.endpoint));
  KVF_RETURN_IF_ERROR(f.required("incarnation", d.incarnation));
  KVF_RETURN_IF_ERROR(f.required("host_id", d.host_id));
  KVF_RETURN_IF_ERROR(f.required("pid", d.pid));
  KVF_RETURN_IF_ERROR(f.required("version", d.version));
  KVF_RETURN_IF_ERROR(f.optional("tcp_endpoint", d.tcp_endpoint));
  KVF_RETURN_IF_ERROR(f.optional("shm_socket", d.shm_socket));
  KVF_RETURN_IF_ERROR(f.optional("cma_socket", d.cma_socket));
  for (const std::string* name : {&d.shm_socket, &d.cma_socket}) {
    if (name->size() > kMaxShmSocketNameBytes) {
      return bad(std::string(name == &d.shm_socket ? "shm_socket" : "cma_socket") + " name of " +
                 std::to_string(name->size()) + " bytes exceeds the limit of " +
                 std::to_string(kMaxShmSocketNameBytes));
    }
  }
  KVF_RETURN_IF_ERROR(f.optional("notify_endpoint", d.notify_endpoint));
  if (const json* ucx = f.optional_value("ucx")) {
    KVF_ASSIGN_OR_RETURN(JsonFields u, JsonFields::of(*ucx, "'ucx'", backing_errors("ucx")));
    KVF_ASSIGN_OR_RETURN(d.ucx, parse_ucx(std::move(u)));
  }
  KVF_ASSIGN_OR_RETURN(std::vector<std::string> transports,
                       f.required_list<std::string>("transports"));
  for (const std::string& name : transports) {
    // Unknown names (from a newer peer) are skipped: we cannot use what we do not know.
    auto kind = parse_transport_kind(name);
    if (kind.ok()) d.transports.insert(*kind);
  }
  KVF_ASSIGN_OR_RETURN(const json* regions, f.required_array("regions"));
  if (regions->size() > kMaxDescriptorRegions) {
    return bad(std::to_string(regions->size()) + " regions exceed the limit of " +
               std::to_string(kMaxDescriptorRegions));
  }
  KVF_RETURN_IF_ERROR(f.finish());
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
