// execute(): runs a plan's calls through a PlanSink as its strategy says.
#include "kvferry/kv/plan_executor.h"

#include <utility>
#include <vector>

namespace kvferry::kv {
namespace {

// The plan's blocks as engine ops, one array for the whole plan so every call's span stays
// valid until execute() returns.
std::vector<TransferOp> to_ops(const TransferPlan& plan, OpKind kind) {
  std::vector<TransferOp> ops;
  ops.reserve(plan.num_blocks());
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    const PlanCall call = plan.call(c);
    for (size_t b = 0; b < call.num_blocks(); ++b) {
      // A WRITE's local side is the plan's source; a READ's local side is its destination.
      ops.push_back(kind == OpKind::kWrite
                        ? TransferOp{kind, call.src[b], call.dst[b], call.len[b]}
                        : TransferOp{kind, call.dst[b], call.src[b], call.len[b]});
    }
  }
  return ops;
}

// The ops of each call, in plan order.
std::vector<std::span<const TransferOp>> split_calls(const TransferPlan& plan,
                                                     std::span<const TransferOp> ops) {
  std::vector<std::span<const TransferOp>> calls;
  calls.reserve(plan.num_calls());
  size_t offset = 0;
  for (size_t c = 0; c < plan.num_calls(); ++c) {
    const size_t n = plan.call(c).num_blocks();
    calls.push_back(ops.subspan(offset, n));
    offset += n;
  }
  return calls;
}

Status run_one(PlanSink& sink, std::span<const TransferOp> ops) {
  KVF_ASSIGN_OR_RETURN(PlanSink::CallId id, sink.submit(ops));
  return sink.wait(id);
}

Status run_sequentially(PlanSink& sink, std::span<const std::span<const TransferOp>> calls) {
  for (std::span<const TransferOp> ops : calls) KVF_RETURN_IF_ERROR(run_one(sink, ops));
  return Status::Ok();
}

// Submits every call, then waits for each. After the first failure the calls not yet waited
// for are cancelled, and still waited for, so none is writing when this returns.
Status run_concurrently(PlanSink& sink, std::span<const std::span<const TransferOp>> calls) {
  std::vector<PlanSink::CallId> submitted;
  submitted.reserve(calls.size());
  Status first_error;
  for (std::span<const TransferOp> ops : calls) {
    Result<PlanSink::CallId> id = sink.submit(ops);
    if (!id.ok()) {
      first_error = id.status();
      break;
    }
    submitted.push_back(*id);
  }
  if (!first_error.ok()) {
    for (PlanSink::CallId id : submitted) sink.cancel(id);
  }
  for (size_t i = 0; i < submitted.size(); ++i) {
    Status status = sink.wait(submitted[i]);
    if (!status.ok() && first_error.ok()) {
      first_error = std::move(status);
      for (size_t j = i + 1; j < submitted.size(); ++j) sink.cancel(submitted[j]);
    }
  }
  return first_error;
}

}  // namespace

Status execute(const TransferPlan& plan, PlanSink& sink, const ExecuteOptions& options) {
  if (plan.num_calls() == 0) return Status::Ok();
  const std::vector<TransferOp> ops = to_ops(plan, options.kind);
  const std::vector<std::span<const TransferOp>> calls = split_calls(plan, ops);
  switch (plan.strategy()) {
    case SendStrategy::kPerLayer: return run_concurrently(sink, calls);
    case SendStrategy::kAllLayers:
    case SendStrategy::kIndexSharded: return run_sequentially(sink, calls);
  }
  return Internal("plan has an unknown strategy");
}

}  // namespace kvferry::kv
