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

// The ops of one batch that one transport carries.
struct ResolvedPart {
  TransportKind transport = TransportKind::kLocal;
  std::vector<ResolvedOp> spans;  // after merging
  uint64_t bytes = 0;
  bool touches_device = false;  // some op reads or writes device memory (local or remote)
};

struct ResolvedBatch {
  std::vector<ResolvedPart> parts;  // in the order their first op came
  std::vector<RegionUse*> uses;     // local regions touched (consecutive duplicates removed)
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
  ResolvedBatch batch;
};

ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           RouteSource& routes);

// Every op to one transport that touches what `access` allows (tests, and callers that
// know the route).
ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           CopyAccess access);

}  // namespace kvferry
