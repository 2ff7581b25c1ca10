#include "engine/op_resolver.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "transport/shm_mapping.h"

namespace kvferry {
namespace {

bool is_device(const RegionEntry& r) { return r.location.kind == MemoryLocation::Kind::kCuda; }

// Why `access` cannot copy to or from region `r` (`side` is "local" or "remote"), or "".
std::string unreachable(const RegionEntry& r, std::string_view side, CopyAccess access,
                        std::string_view peer_name) {
  if (is_device(r)) {
    if (access == CopyAccess::kStagedRemoteAddress) return "";
    if (access == CopyAccess::kDevicePointers) {
      if (r.host_ptr != nullptr || r.cuda) return "";
      return fmt::format(
          "remote region at {:#x} of peer {} is cuda:{} memory without an IPC handle", r.addr,
          peer_name, r.location.device);
    }
    return fmt::format(
        "{} region at {:#x} is cuda:{} memory, which a {} copy cannot touch (device memory "
        "goes through cuda_ipc on one host, or tcp staged through pinned buffers in a CUDA "
        "build)",
        side, r.addr, r.location.device,
        access == CopyAccess::kRemoteAddress ? "tcp" : "host memcpy");
  }
  const bool by_address =
      access == CopyAccess::kRemoteAddress || access == CopyAccess::kStagedRemoteAddress;
  if (side == "remote" && !by_address && r.host_ptr == nullptr) {
    return fmt::format(
        "remote region at {:#x} of peer {} is not shareable (allocate it with allocate_shared)",
        r.addr, peer_name);
  }
  return "";
}

}  // namespace

ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           RouteSource& routes, ResolvedBatch& batch) {
  ResolveOutcome out;
  if (ops.empty()) {
    out.status = InvalidArgument("empty batch: submit needs at least one op");
    return out;
  }
  // Per part: the region pair its last span lies in (merging continues only inside it).
  struct PartCursor {
    const RegionEntry* last_local = nullptr;
    const RegionEntry* last_remote = nullptr;
  };
  std::array<PartCursor, PartList::kCapacity> cursors{};
  size_t local_hint = 0;
  size_t remote_hint = 0;
  const RegionEntry* last_local = nullptr;
  const RegionEntry* last_remote = nullptr;
  size_t part_index = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const TransferOp& op = ops[i];
    if (op.length == 0) {
      out.status = InvalidArgument(fmt::format("op {}: length 0 (local {:#x}, remote {:#x})", i,
                                               op.local_addr, op.remote_addr));
      return out;
    }
    if (op.kind != OpKind::kWrite && op.kind != OpKind::kRead) {
      out.status =
          InvalidArgument(fmt::format("op {}: unknown kind {}", i, static_cast<int>(op.kind)));
      return out;
    }
    const RegionEntry* l = local.find(op.local_addr, op.length, local_hint);
    if (l == nullptr) {
      out.status = NotRegistered(
          fmt::format("op {}: local range [{:#x}, +{}) is outside every registered region", i,
                      op.local_addr, op.length));
      return out;
    }
    const RegionEntry* r = remote.find(op.remote_addr, op.length, remote_hint);
    if (r == nullptr) {
      out.status = NotRegistered(
          fmt::format("op {}: remote range [{:#x}, +{}) is outside every region peer {} advertises",
                      i, op.remote_addr, op.length, peer_name));
      out.remote_miss = true;
      return out;
    }
    if (r != last_remote && r->shm_guard != nullptr &&
        !shm_guard_holds(r->shm_guard, r->shm->generation)) {
      // The peer unregistered it since we read its descriptor: a refreshed one may show
      // what is there now.
      out.status = NotRegistered(fmt::format(
          "op {}: remote range [{:#x}, +{}): peer {} unregistered its shared region at {:#x}", i,
          op.remote_addr, op.length, peer_name, r->addr));
      out.remote_miss = true;
      return out;
    }
    if (l != last_local || r != last_remote) {
      Result<RouteTarget> target = routes.route(RouteKey{l->kind(), r->kind()});
      if (!target.ok()) {
        out.status = Status(target.status().code(),
                            fmt::format("op {} (local {:#x}, remote {:#x}): {}", i, op.local_addr,
                                        op.remote_addr, target.status().message()));
        return out;
      }
      std::string why = unreachable(*l, "local", target->access, peer_name);
      if (why.empty()) why = unreachable(*r, "remote", target->access, peer_name);
      if (!why.empty()) {
        out.status = NotSupported(fmt::format("op {}: {}", i, why));
        return out;
      }
      part_index = batch.parts.size();
      for (size_t p = 0; p < batch.parts.size(); ++p) {
        if (batch.parts[p].transport == target->transport) part_index = p;
      }
      if (part_index == batch.parts.size()) {
        batch.parts.add(target->transport).spans.reserve(ops.size() - i);
      }
      ResolvedPart& part = batch.parts[part_index];
      part.touches_device = part.touches_device || is_device(*l) || is_device(*r);
      if (l != last_local && l->use != nullptr &&
          (batch.uses.empty() || batch.uses.back() != l->use.get())) {
        batch.uses.push_back(l->use.get());
      }
      if (r != last_remote && r->use != nullptr && r->use != l->use &&
          (batch.uses.empty() || batch.uses.back() != r->use.get())) {
        batch.uses.push_back(r->use.get());
      }
      last_local = l;
      last_remote = r;
    }
    ResolvedPart& part = batch.parts[part_index];
    PartCursor& cursor = cursors[part_index];
    ResolvedOp resolved{op.kind, l->host_ptr + (op.local_addr - l->addr), op.remote_addr,
                        r->host_ptr == nullptr ? nullptr : r->host_ptr + (op.remote_addr - r->addr),
                        op.length};
    if (r->shm_guard != nullptr) resolved.remote_shm = r;
    batch.bytes += op.length;
    part.bytes += op.length;
    if (merge && l == cursor.last_local && r == cursor.last_remote) {
      ResolvedOp& prev = part.spans.back();
      if (prev.kind == resolved.kind && prev.local + prev.length == resolved.local &&
          prev.remote_addr + prev.length == resolved.remote_addr) {
        prev.length += resolved.length;
        continue;
      }
    }
    cursor.last_local = l;
    cursor.last_remote = r;
    part.spans.push_back(resolved);
  }
  return out;
}

namespace {

// Which memory an op's destination is in: the peer's (WRITE) or ours (READ).
size_t destination_space(const TransferOp& op, bool one_address_space) {
  return one_address_space || op.kind == OpKind::kWrite ? 0 : 1;
}
uint64_t destination(const TransferOp& op) {
  return op.kind == OpKind::kWrite ? op.remote_addr : op.local_addr;
}
// Saturating: a range that wraps is refused elsewhere, and must not look disjoint here.
uint64_t destination_end(const TransferOp& op) {
  const uint64_t start = destination(op);
  return start + op.length < start ? UINT64_MAX : start + op.length;
}

Status overlap_error(std::span<const TransferOp> ops, size_t a, size_t b) {
  if (a > b) std::swap(a, b);
  return InvalidArgument(fmt::format(
      "ops {} and {} have overlapping destinations [{:#x}, +{}) and [{:#x}, +{}) (which bytes "
      "would win is unspecified): refused",
      a, b, destination(ops[a]), ops[a].length, destination(ops[b]), ops[b].length));
}

// Sorts check_disjoint_by_sorting's keys (bits above `high` zero, the index below `low`) by
// their bits [low, high): an LSD radix sort, up to 11 bits a pass (8 below kWideDigitOps
// keys: 2,048 counters cost more than a pass saves), every pass counted in one read. A few
// linear passes where std::sort of a shuffled 10,000-op batch took 6x as long as resolving it
// (docs/PERFORMANCE.md). Written by hand: no library here sorts integers by radix. Below
// kRadixSortMinOps a comparison sort of the whole keys is cheaper (same order: ties go by
// index): each pass clears and scans its counters, which for the 16 ops of a 1 MiB batch of
// 64 KiB blocks cost about 1 us of a 17 us batch (6% of the shm cell; docs/PERFORMANCE.md,
// "Engine: local and shm against memcpy").
constexpr size_t kRadixSortMinOps = 128;
constexpr size_t kWideDigitOps = size_t{1} << 16;
void radix_sort(std::vector<uint64_t>& keys, std::vector<uint64_t>& scratch, unsigned low,
                unsigned high) {
  if (keys.size() < kRadixSortMinOps) {
    std::sort(keys.begin(), keys.end());
    return;
  }
  if (high <= low) return;
  const unsigned most_digit_bits = keys.size() < kWideDigitOps ? 8 : 11;
  const unsigned passes = (high - low + most_digit_bits - 1) / most_digit_bits;
  const unsigned digit_bits = (high - low + passes - 1) / passes;  // evened out
  const uint64_t mask = (uint64_t{1} << digit_bits) - 1;
  const size_t buckets = size_t{1} << digit_bits;
  std::vector<size_t> first(passes * (buckets + 1), 0);  // pass p: [p * (buckets + 1), ...)
  for (const uint64_t k : keys) {
    for (unsigned p = 0; p < passes; ++p) {
      ++first[p * (buckets + 1) + ((k >> (low + p * digit_bits)) & mask) + 1];
    }
  }
  scratch.resize(keys.size());
  for (unsigned p = 0; p < passes; ++p) {
    size_t* at = first.data() + p * (buckets + 1);
    const unsigned shift = low + p * digit_bits;
    if (at[((keys.front() >> shift) & mask) + 1] == keys.size()) continue;  // one digit: sorted
    for (size_t d = 1; d <= buckets; ++d) at[d] += at[d - 1];
    for (const uint64_t k : keys) scratch[at[(k >> shift) & mask]++] = k;
    keys.swap(scratch);
  }
}

// The same check by std::sort of (start, index) pairs: for starts too far apart to pack.
Status check_disjoint_by_comparison_sort(std::span<const TransferOp> ops, bool one_address_space) {
  std::vector<std::pair<uint64_t, size_t>> sorted;
  sorted.reserve(ops.size());
  for (const size_t space : {size_t{0}, size_t{1}}) {
    sorted.clear();
    for (size_t i = 0; i < ops.size(); ++i) {
      if (destination_space(ops[i], one_address_space) == space) {
        sorted.emplace_back(destination(ops[i]), i);
      }
    }
    std::sort(sorted.begin(), sorted.end());
    for (size_t k = 1; k < sorted.size(); ++k) {
      const size_t prev = sorted[k - 1].second;
      if (sorted[k].first < destination_end(ops[prev])) {
        return overlap_error(ops, prev, sorted[k].second);
      }
    }
  }
  return Status::Ok();
}

// The check for ops out of destination order. Each op of a space becomes one 8-byte key: the
// bits in which its space's starts differ (addresses in one region share their high bits,
// aligned blocks their low ones) above, its index below. Sorting the keys sorts the ops by
// start; each op's start and end are then read from `ops`. 8 bytes where (start, index)
// pairs took 16: a million-op sort moves them through memory, not cache. Starts spread over
// more bits than the index leaves (over 2^44 bytes at a million ops) fall back to sorting
// pairs. The buffers stay with the submitting thread for its next batch (fresh ones for a
// million ops are thousands of newly touched pages, each a page fault), up to
// kKeptSortBuffer bytes each.
Status check_disjoint_by_sorting(std::span<const TransferOp> ops, bool one_address_space) {
  constexpr size_t kKeptSortBuffer = size_t{16} << 20;  // two million ops
  thread_local std::array<std::vector<uint64_t>, 3> buffers;
  struct EmptyAfter {
    std::array<std::vector<uint64_t>, 3>& buffers;
    ~EmptyAfter() {
      for (auto& b : buffers) {
        b.clear();
        if (b.capacity() * sizeof(uint64_t) > kKeptSortBuffer) b = {};
      }
    }
  } empty_after{buffers};
  auto& [in_peer, in_ours, scratch] = buffers;
  struct Space {
    std::vector<uint64_t>* keys = nullptr;
    uint64_t first = 0;
    uint64_t differ = 0;  // OR of every start XOR the first
    size_t count = 0;
    unsigned low = 0;  // the bits in which the starts differ: [low, low + bits)
    unsigned bits = 0;
  };
  std::array<Space, 2> spaces{Space{&in_peer}, Space{&in_ours}};
  for (const TransferOp& op : ops) {
    Space& s = spaces[destination_space(op, one_address_space)];
    if (s.count++ == 0) s.first = destination(op);
    s.differ |= destination(op) ^ s.first;
  }
  const auto index_bits = static_cast<unsigned>(std::bit_width(ops.size()));
  for (Space& s : spaces) {
    if (s.differ == 0) continue;  // at most one start: sorted as it is
    s.low = static_cast<unsigned>(std::countr_zero(s.differ));
    s.bits = 64 - static_cast<unsigned>(std::countl_zero(s.differ)) - s.low;
    if (s.bits + index_bits > 64) return check_disjoint_by_comparison_sort(ops, one_address_space);
    s.keys->reserve(s.count);
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    Space& s = spaces[destination_space(ops[i], one_address_space)];
    const uint64_t differing = (destination(ops[i]) >> s.low) & ((uint64_t{1} << s.bits) - 1);
    s.keys->push_back((differing << index_bits) | i);
  }
  const uint64_t index_mask = (uint64_t{1} << index_bits) - 1;
  for (Space& s : spaces) {
    std::vector<uint64_t>& keys = *s.keys;
    radix_sort(keys, scratch, index_bits, index_bits + s.bits);
    for (size_t k = 1; k < keys.size(); ++k) {
      const size_t prev = keys[k - 1] & index_mask;
      const size_t next = keys[k] & index_mask;
      if (destination(ops[next]) < destination_end(ops[prev])) {
        return overlap_error(ops, prev, next);
      }
    }
  }
  return Status::Ok();
}

// One pass while the destinations descend in each space: the blocks of a list handed out
// from a free list that took them back last first (vLLM frees a request's blocks in reverse
// order). nullopt once one does not descend.
std::optional<Status> check_descending_destinations(std::span<const TransferOp> ops,
                                                    bool one_address_space) {
  std::array<uint64_t, 2> start{0, 0};
  std::array<size_t, 2> last{SIZE_MAX, SIZE_MAX};
  for (size_t i = 0; i < ops.size(); ++i) {
    const size_t space = destination_space(ops[i], one_address_space);
    if (last[space] != SIZE_MAX) {
      if (destination(ops[i]) >= start[space]) return std::nullopt;
      if (destination_end(ops[i]) > start[space]) return overlap_error(ops, last[space], i);
    }
    start[space] = destination(ops[i]);
    last[space] = i;
  }
  return Status::Ok();
}

}  // namespace

Status check_disjoint_destinations(std::span<const TransferOp> ops, bool one_address_space) {
  // One pass while the destinations ascend in each space, another while they descend.
  std::array<uint64_t, 2> end{0, 0};
  std::array<size_t, 2> last{SIZE_MAX, SIZE_MAX};
  for (size_t i = 0; i < ops.size(); ++i) {
    const size_t space = destination_space(ops[i], one_address_space);
    if (last[space] != SIZE_MAX && destination(ops[i]) < end[space]) {
      if (destination(ops[i]) >= destination(ops[last[space]])) {
        return overlap_error(ops, last[space], i);
      }
      if (std::optional<Status> descending =
              check_descending_destinations(ops, one_address_space)) {
        return *descending;
      }
      return check_disjoint_by_sorting(ops, one_address_space);  // out of order
    }
    end[space] = destination_end(ops[i]);
    last[space] = i;
  }
  return Status::Ok();
}

ResolvedOps resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                        const RegionIndex& remote, std::string_view peer_name, bool merge,
                        RouteSource& routes) {
  ResolvedOps out;
  ResolveOutcome outcome = resolve_ops(ops, local, remote, peer_name, merge, routes, out.batch);
  out.status = std::move(outcome.status);
  out.remote_miss = outcome.remote_miss;
  return out;
}

ResolvedOps resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                        const RegionIndex& remote, std::string_view peer_name, bool merge,
                        CopyAccess access) {
  class OneRoute final : public RouteSource {
   public:
    explicit OneRoute(CopyAccess a) : access_(a) {}
    Result<RouteTarget> route(RouteKey) override {
      return RouteTarget{TransportKind::kLocal, access_};
    }

   private:
    CopyAccess access_;
  } routes(access);
  return resolve_ops(ops, local, remote, peer_name, merge, routes);
}

}  // namespace kvferry
