#include "engine/op_resolver.h"

#include <fmt/format.h>

namespace kvferry {

ResolveOutcome resolve_ops(std::span<const TransferOp> ops, const RegionIndex& local,
                           const RegionIndex& remote, std::string_view peer_name, bool merge,
                           bool need_remote_pointer) {
  ResolveOutcome out;
  if (ops.empty()) {
    out.status = InvalidArgument("empty batch: submit needs at least one op");
    return out;
  }
  ResolvedBatch& batch = out.batch;
  batch.spans.reserve(ops.size());
  size_t local_hint = 0;
  size_t remote_hint = 0;
  const RegionEntry* last_local = nullptr;
  const RegionEntry* last_remote = nullptr;
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
    if (need_remote_pointer && r->host_ptr == nullptr) {
      out.status = NotSupported(
          fmt::format("op {}: remote region at {:#x} of peer {} is not shareable (allocate it with "
                      "allocate_shared)",
                      i, r->addr, peer_name));
      return out;
    }
    ResolvedOp resolved{op.kind, l->host_ptr + (op.local_addr - l->addr), op.remote_addr,
                        r->host_ptr == nullptr ? nullptr : r->host_ptr + (op.remote_addr - r->addr),
                        op.length};
    batch.bytes += op.length;
    if (merge && l == last_local && r == last_remote) {
      ResolvedOp& prev = batch.spans.back();
      if (prev.kind == resolved.kind && prev.local + prev.length == resolved.local &&
          prev.remote_addr + prev.length == resolved.remote_addr) {
        prev.length += resolved.length;
        continue;
      }
    }
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
    batch.spans.push_back(resolved);
  }
  return out;
}

}  // namespace kvferry
