// resolve_ops: the check-route-merge step every batch goes through before any byte moves.
//
// Each op is checked against the local regions (its local range inside one region) and
// the peer's regions (its remote range inside one advertised region), routed by the memory
// kinds of those two regions (RouteSource), checked against what the route's transport can
// touch (CopyAccess), translated to pointers this process can use, and merged with the
// previous op of the same route when both sides continue it contiguously inside the same
// two regions. The result is one part per transport.
//
// Thread-safety: pure function over immutable inputs (the route source is the caller's).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "kvferry/status.h"
#include "kvferry/transfer_types.h"
#include "transport/region_index.h"
#include "transport/resolved_op.h"
#include "transport/transport.h"

namespace kvferry {

using ResolvedSpans = std::vector<ResolvedOp>;

// The ops of one batch that one transport carries.
struct ResolvedPart {
  TransportKind transport = TransportKind::kLocal;
  ResolvedSpans spans;  // after merging
  uint64_t bytes = 0;
  bool touches_device = false;  // some op reads or writes device memory (local or remote)
};

// At most one part per transport kind, held inline: a batch costs no allocation for them.
class PartList {
 public:
  static constexpr size_t kCapacity = kAllTransportKinds.size();
  size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  ResolvedPart& operator[](size_t i) { return parts_[i]; }
  const ResolvedPart& operator[](size_t i) const { return parts_[i]; }
  ResolvedPart& front() { return parts_[0]; }
  const ResolvedPart& front() const { return parts_[0]; }
  ResolvedPart* begin() { return parts_.data(); }
  ResolvedPart* end() { return parts_.data() + count_; }
  const ResolvedPart* begin() const { return parts_.data(); }
  const ResolvedPart* end() const { return parts_.data() + count_; }
  ResolvedPart& add(TransportKind transport) {  // count_ < kCapacity: one part per kind
    ResolvedPart& p = parts_[count_++];
    p.transport = transport;
    return p;
  }
  // Empty storage for the next part's spans, which add() keeps (engine/span_recycler.h).
  void lend(ResolvedSpans storage) { parts_[count_].spans = std::move(storage); }
  // Every slot, used or not: where lent storage may be.
  std::span<ResolvedPart> slots() { return parts_; }

 private:
  std::array<ResolvedPart, kCapacity> parts_{};
  size_t count_ = 0;
};

struct ResolvedBatch {
  PartList parts;                // in the order their first op came
  std::vector<RegionUse*> uses;  // local regions touched (consecutive duplicates removed)
  uint64_t bytes = 0;
  size_t span_count() const {
    size_t n = 0;
    for (const ResolvedPart& p : parts) n += p.spans.size();
    return n;
  }
};

// Where ops of a route go: the transport and what it can touch.
struct RouteTarget {
  TransportKind transport = TransportKind::kLocal;
  CopyAccess access = CopyAccess::kHostPointers;
};

class RouteSource {
 public:
  virtual ~RouteSource() = default;
  // The transport for ops of `key`, or NotSupported saying why none carries them.
  virtual Result<RouteTarget> route(RouteKey key) = 0;
};

struct ResolveOutcome {
  Status status;
  // The failure was a remote range outside the peer's regions: a refreshed descriptor
  // may know the region.
  bool remote_miss = false;
};

// Resolves into `out` (which must be empty): the batch record's own storage, so the data
// path moves no part list around.
ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           RouteSource& routes, ResolvedBatch& out);

// InvalidArgument naming two ops whose destinations overlap (a WRITE's remote range, a
// READ's local range): their bytes would land in an order no one chose, concurrently on
// different threads or lanes. `one_address_space`: the peer is this engine itself, so both
// kinds land in the same memory. Ops in ascending, disjoint destination order (what the
// planner emits) cost one pass, and in descending order another; otherwise the destinations
// are sorted, O(n log n).
Status check_disjoint_destinations(std::span<const TransferOp> ops, bool one_address_space);

// The outcome with the batch it resolved (tests).
struct ResolvedOps {
  Status status;
  bool remote_miss = false;
  ResolvedBatch batch;
};
ResolvedOps resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                        const RegionIndex& remote, std::string_view peer_name, bool merge,
                        RouteSource& routes);
// Every op to one transport that touches what `access` allows.
ResolvedOps resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                        const RegionIndex& remote, std::string_view peer_name, bool merge,
                        CopyAccess access);

}  // namespace kvferry
