// Running a TransferPlan: execute() submits the plan's calls the way its strategy says and
// returns the first error.
//
//  * kAllLayers: the single call is submitted and waited for.
//  * kPerLayer: every call is submitted before any is waited for, so they run concurrently.
//    When one fails (at submit or at completion), the calls not yet finished are cancelled
//    and still waited for: when execute() returns, nothing of the plan is writing.
//  * kIndexSharded: calls run one after the other; the first failure stops the rest.
//
// The engine sits behind PlanSink so the strategy logic can be tested without one;
// EnginePlanSink adapts a TransferEngine and a peer.
//
// Thread-safety: execute() uses its sink from the calling thread only. A sink is used by
// one execute() at a time unless its implementation says otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "kvferry/kv/transfer_plan.h"
#include "kvferry/status.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::kv {

// Where execute() sends calls. submit() starts a call and may return before it completes;
// wait() blocks until it ended and returns its final status; cancel() stops it and returns
// once none of its bytes is being written (wait() must still be called afterwards).
class PlanSink {
 public:
  using CallId = uint64_t;

  virtual ~PlanSink() = default;
  // `ops` stays valid until wait() for this call returned.
  virtual Result<CallId> submit(std::span<const TransferOp> ops) = 0;
  virtual Status wait(CallId call) = 0;
  virtual void cancel(CallId call) = 0;
};

struct ExecuteOptions {
  // WRITE pushes the plan's src (local) to its dst (the peer); READ pulls the plan's dst
  // (local) from its src (the peer).
  OpKind kind = OpKind::kWrite;
  // Timeout of each call; zero = the engine's batch timeout.
  std::chrono::milliseconds call_timeout{0};
};

// Runs `plan` through `sink`. An empty plan succeeds without a call. Returns the first error.
Status execute(const TransferPlan& plan, PlanSink& sink, const ExecuteOptions& options = {});

// A PlanSink over a TransferEngine and an opened peer. Borrows both: they must outlive it.
class EnginePlanSink final : public PlanSink {
 public:
  EnginePlanSink(TransferEngine& engine, PeerHandle peer, SubmitOptions submit_options = {});

  Result<CallId> submit(std::span<const TransferOp> ops) override;
  Status wait(CallId call) override;
  void cancel(CallId call) override;

 private:
  TransferEngine& engine_;
  PeerHandle peer_;
  SubmitOptions submit_options_;
  std::vector<BatchHandle> batches_;  // indexed by CallId
};

// execute() on an engine: `local` pages are this engine's registered memory, the peer's are
// remote. Errors are the engine's (NotRegistered, PeerDisconnected, Timeout, ...).
Status execute(const TransferPlan& plan, TransferEngine& engine, const PeerHandle& peer,
               const ExecuteOptions& options = {});

}  // namespace kvferry::kv
