#include "transport/ucx/ucx_am_wire.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>

namespace kvferry::detail {
namespace {

constexpr size_t kRequestIdAt = 0;
constexpr size_t kAddrAt = 8;
constexpr size_t kLengthAt = 16;
constexpr size_t kDeadlineAt = 24;
constexpr size_t kStatusAt = 32;

template <typename T>
void put(UcxAmHeaderBytes& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(value));
}

template <typename T>
T get(const std::byte* in, size_t at) {
  T value{};
  std::memcpy(&value, in + at, sizeof(value));
  return value;
}

}  // namespace

UcxAmHeaderBytes encode_ucx_am_header(const UcxAmHeader& h) {
  UcxAmHeaderBytes out{};
  put(out, kRequestIdAt, h.request_id);
  put(out, kAddrAt, h.addr);
  put(out, kLengthAt, h.length);
  put(out, kDeadlineAt, h.deadline_ns);
  put(out, kStatusAt, h.status);
  return out;
}

Result<UcxAmHeader> decode_ucx_am_header(const void* bytes, size_t size) {
  if (size != kUcxAmHeaderBytes || bytes == nullptr) {
    return ProtocolError(fmt::format("ucx active message header of {} bytes (expected {})", size,
                                     kUcxAmHeaderBytes));
  }
  const auto* in = static_cast<const std::byte*>(bytes);
  UcxAmHeader h;
  h.request_id = get<uint64_t>(in, kRequestIdAt);
  h.addr = get<uint64_t>(in, kAddrAt);
  h.length = get<uint64_t>(in, kLengthAt);
  h.deadline_ns = get<int64_t>(in, kDeadlineAt);
  h.status = get<uint32_t>(in, kStatusAt);
  if (!is_valid_status_code(h.status)) {
    return ProtocolError(fmt::format("ucx active message carries status code {}", h.status));
  }
  return h;
}

UcxDataPath choose_ucx_data_path(bool local_hardware_rma, bool peer_hardware_rma) {
  return local_hardware_rma && peer_hardware_rma ? UcxDataPath::kRma : UcxDataPath::kActiveMessages;
}

const char* ucx_data_path_name(UcxDataPath path) {
  return path == UcxDataPath::kRma ? "put/get (hardware RMA)" : "active messages";
}

int64_t ucx_clock_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

int64_t ucx_clock_offset_ns(int64_t target_ns, int64_t received_ns) {
  return target_ns - received_ns;
}

int64_t ucx_target_deadline_ns(Clock::time_point deadline, int64_t offset_ns) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  if (deadline == Clock::time_point::max()) return kMax;
  const int64_t ns = ucx_clock_ns(deadline);
  if (offset_ns > 0 && ns > kMax - offset_ns) return kMax;
  if (offset_ns < 0 && ns < kMin - offset_ns) return kMin;
  return ns + offset_ns;
}

Status ucx_am_reply_status(uint32_t status_code, std::string_view peer, std::string_view what) {
  if (status_code == 0) return Status::Ok();
  const auto code = static_cast<StatusCode>(status_code);
  return Status(code, fmt::format("ucx {} refused by {}: {}", what, peer, status_code_name(code)));
}

UcxAmPin& UcxAmPin::operator=(UcxAmPin&& o) noexcept {
  if (this != &o) {
    release();
    snapshot = std::move(o.snapshot);
    use = std::exchange(o.use, nullptr);
    ptr = o.ptr;
  }
  return *this;
}

void UcxAmPin::release() {
  if (use != nullptr) use->in_flight.fetch_sub(1);
  use = nullptr;
  snapshot.reset();
}

Result<UcxAmPin> check_ucx_am_target(const std::shared_ptr<const RegionIndex>& regions,
                                     uint64_t addr, uint64_t length, int64_t deadline_ns,
                                     int64_t now_ns, int64_t margin_ns) {
  if (now_ns > deadline_ns) {
    return Timeout(fmt::format("request for [{:#x}, +{}) arrived {} us past its deadline", addr,
                               length, (now_ns - deadline_ns) / 1000));
  }
  if (now_ns + margin_ns > deadline_ns) {
    return Timeout(
        fmt::format("write to [{:#x}, +{}) arrived {} us before its deadline; it lands "
                    "only {} us or more before",
                    addr, length, (deadline_ns - now_ns) / 1000, margin_ns / 1000));
  }
  size_t hint = 0;
  const RegionEntry* r = regions != nullptr ? regions->find(addr, length, hint) : nullptr;
  if (r == nullptr || r->use == nullptr || r->host_ptr == nullptr) {
    return NotRegistered(fmt::format(
        "range [{:#x}, +{}) is outside every registered region of the target", addr, length));
  }
  if (r->location.kind != MemoryLocation::Kind::kHost) {
    return NotSupported(fmt::format(
        "range [{:#x}, +{}) is device memory; ucx moves host memory only", addr, length));
  }
  r->use->in_flight.fetch_add(1);
  if (r->use->removed.load()) {
    r->use->in_flight.fetch_sub(1);
    return NotRegistered(fmt::format("region at {:#x} is being unregistered", r->addr));
  }
  return UcxAmPin(regions, r->use.get(), r->host_ptr + (addr - r->addr));
}

}  // namespace kvferry::detail
