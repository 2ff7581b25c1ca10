// EnginePlanSink: PlanSink over a TransferEngine. Kept apart from plan_executor.cc so the
// strategy logic builds and tests without an engine.
#include <chrono>
#include <string>
#include <utility>

#include "kvferry/kv/plan_executor.h"

namespace kvferry::kv {
namespace {

// One wait() slice; a pending batch is waited for again until it ends (every batch ends
// within its own timeout, so the loop terminates).
constexpr std::chrono::milliseconds kWaitSlice{60'000};

}  // namespace

EnginePlanSink::EnginePlanSink(TransferEngine& engine, PeerHandle peer,
                               SubmitOptions submit_options)
    : engine_(engine), peer_(std::move(peer)), submit_options_(std::move(submit_options)) {}

Result<PlanSink::CallId> EnginePlanSink::submit(std::span<const TransferOp> ops) {
  KVF_ASSIGN_OR_RETURN(BatchHandle batch, engine_.submit(peer_, ops, submit_options_));
  batches_.push_back(std::move(batch));
  return static_cast<CallId>(batches_.size() - 1);
}

Status EnginePlanSink::wait(CallId call) {
  if (call >= batches_.size()) {
    return InvalidArgument("call id " + std::to_string(call) + " was not submitted here");
  }
  for (;;) {
    BatchStatus status = engine_.wait(batches_[call], kWaitSlice);
    switch (status.state) {
      case BatchState::kPending: continue;
      case BatchState::kCompleted: return Status::Ok();
      case BatchState::kFailed: return status.status;
    }
  }
}

void EnginePlanSink::cancel(CallId call) {
  if (call < batches_.size()) engine_.cancel(batches_[call]);
}

Status execute(const TransferPlan& plan, TransferEngine& engine, const PeerHandle& peer,
               const ExecuteOptions& options) {
  EnginePlanSink sink(engine, peer, SubmitOptions{.timeout = options.call_timeout});
  return execute(plan, sink, options);
}

}  // namespace kvferry::kv
