// execute() against sinks that record what happened and fail on demand.
#include "kvferry/kv/plan_executor.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvferry/kv/planner.h"
#include "plan_test_util.h"

namespace kvferry::kv {
namespace {

// Records "submit N", "wait N", "cancel N"; fails chosen calls at submit or at wait.
class RecordingSink : public PlanSink {
 public:
  std::set<CallId> fail_submit;
  std::map<CallId, Status> fail_wait;
  std::vector<std::string> events;
  std::vector<std::vector<TransferOp>> calls;

  Result<CallId> submit(std::span<const TransferOp> ops) override {
    const CallId id = next_++;
    events.push_back("submit " + std::to_string(id));
    if (fail_submit.count(id)) return PeerDisconnected("call " + std::to_string(id) + " refused");
    calls.emplace_back(ops.begin(), ops.end());
    return id;
  }
  Status wait(CallId call) override {
    events.push_back("wait " + std::to_string(call));
    auto it = fail_wait.find(call);
    return it == fail_wait.end() ? Status::Ok() : it->second;
  }
  void cancel(CallId call) override { events.push_back("cancel " + std::to_string(call)); }

 private:
  CallId next_ = 0;
};

KvLayout two_entries(uint64_t a, uint64_t b) {
  return *KvLayout::create(KvLayoutInfo{}, {contiguous_entry(a, 10, 15, KvRole::kOpaque, 0),
                                            contiguous_entry(b, 20, 15, KvRole::kOpaque, 1)});
}

TransferPlan two_entry_plan(SendStrategy strategy, uint32_t max_pages = 0) {
  std::vector<PageIndex> src{0, 1, 2, 3, 4}, dst{10, 11, 12, 13, 14};
  return *build_transfer_plan(two_entries(1000, 2000), two_entries(5000, 6000), src, dst,
                              {.strategy = strategy, .max_pages_per_call = max_pages});
}

using Events = std::vector<std::string>;

TEST(ExecuteAllLayers, IsOneSubmitAndOneWait) {
  RecordingSink sink;
  ASSERT_TRUE(execute(two_entry_plan(SendStrategy::kAllLayers), sink).ok());
  EXPECT_EQ(sink.events, (Events{"submit 0", "wait 0"}));
  ASSERT_EQ(sink.calls.size(), 1u);
  ASSERT_EQ(sink.calls[0].size(), 2u);
  EXPECT_EQ(sink.calls[0][1].kind, OpKind::kWrite);
  EXPECT_EQ(sink.calls[0][1].local_addr, 2000u);
  EXPECT_EQ(sink.calls[0][1].remote_addr, 6200u);
  EXPECT_EQ(sink.calls[0][1].length, 100u);
}

TEST(ExecuteIndexSharded, RunsCallsOneAfterTheOther) {
  RecordingSink sink;
  ASSERT_TRUE(execute(two_entry_plan(SendStrategy::kIndexSharded, 2), sink).ok());
  EXPECT_EQ(sink.events,
            (Events{"submit 0", "wait 0", "submit 1", "wait 1", "submit 2", "wait 2"}));
}

TEST(ExecuteIndexSharded, FailingSecondCallStopsAfterTwoCallsWithItsError) {
  RecordingSink sink;
  sink.fail_wait[1] = Timeout("call 1 timed out");
  Status status = execute(two_entry_plan(SendStrategy::kIndexSharded, 2), sink);
  EXPECT_EQ(status.code(), StatusCode::kTimeout);
  EXPECT_EQ(status.message(), "call 1 timed out");
  EXPECT_EQ(sink.events, (Events{"submit 0", "wait 0", "submit 1", "wait 1"}));
}

TEST(ExecuteIndexSharded, SubmitFailureStopsTooWithItsError) {
  RecordingSink sink;
  sink.fail_submit.insert(1);
  Status status = execute(two_entry_plan(SendStrategy::kIndexSharded, 2), sink);
  EXPECT_EQ(status.code(), StatusCode::kPeerDisconnected);
  EXPECT_EQ(sink.events, (Events{"submit 0", "wait 0", "submit 1"}));
}

TEST(ExecutePerLayer, SubmitsEveryCallBeforeWaitingForAny) {
  RecordingSink sink;
  ASSERT_TRUE(execute(two_entry_plan(SendStrategy::kPerLayer), sink).ok());
  EXPECT_EQ(sink.events, (Events{"submit 0", "submit 1", "wait 0", "wait 1"}));
  ASSERT_EQ(sink.calls.size(), 2u);
  EXPECT_EQ(sink.calls[0][0].remote_addr, 5100u);
  EXPECT_EQ(sink.calls[1][0].remote_addr, 6200u);
}

TEST(ExecutePerLayer, FailureCancelsTheRestAndStillWaitsForThem) {
  MhaShape shape{.num_layers = 2,
                 .page_size_tokens = 1,
                 .kv_heads = 1,
                 .k_head_dim = 4,
                 .v_head_dim = 4,
                 .dtype_bytes = 1,
                 .num_pages = 4};
  std::vector<PageIndex> pages{0, 1};
  TransferPlan plan = *build_transfer_plan(*KvLayout::mha(shape, 0), *KvLayout::mha(shape, 4096),
                                           pages, pages, {.strategy = SendStrategy::kPerLayer});
  ASSERT_EQ(plan.num_calls(), 4u);
  RecordingSink sink;
  sink.fail_wait[1] = PeerDisconnected("peer went away");
  sink.fail_wait[2] = Cancelled("cancelled");
  Status status = execute(plan, sink);
  EXPECT_EQ(status.code(), StatusCode::kPeerDisconnected) << "the first error wins";
  EXPECT_EQ(sink.events, (Events{"submit 0", "submit 1", "submit 2", "submit 3", "wait 0", "wait 1",
                                 "cancel 2", "cancel 3", "wait 2", "wait 3"}));
}

TEST(ExecutePerLayer, SubmitFailureCancelsAndWaitsForTheSubmittedCalls) {
  RecordingSink sink;
  sink.fail_submit.insert(1);
  Status status = execute(two_entry_plan(SendStrategy::kPerLayer), sink);
  EXPECT_EQ(status.code(), StatusCode::kPeerDisconnected);
  EXPECT_EQ(sink.events, (Events{"submit 0", "submit 1", "cancel 0", "wait 0"}));
}

TEST(Execute, EmptyPlanMakesNoCall) {
  RecordingSink sink;
  std::vector<PageIndex> none;
  TransferPlan plan =
      *build_transfer_plan(two_entries(1000, 2000), two_entries(5000, 6000), none, none);
  EXPECT_TRUE(execute(plan, sink).ok());
  EXPECT_TRUE(sink.events.empty());
}

TEST(Execute, ReadPullsThePlansSourceFromThePeer) {
  RecordingSink sink;
  ASSERT_TRUE(
      execute(two_entry_plan(SendStrategy::kAllLayers), sink, {.kind = OpKind::kRead}).ok());
  const TransferOp& op = sink.calls[0][0];
  EXPECT_EQ(op.kind, OpKind::kRead);
  EXPECT_EQ(op.local_addr, 5100u);  // the plan's destination is local when reading
  EXPECT_EQ(op.remote_addr, 1000u);
}

// A sink that copies each call on its own thread: per-layer calls really run concurrently and
// every byte is in place when execute() returns.
class ThreadedCopySink : public PlanSink {
 public:
  Result<CallId> submit(std::span<const TransferOp> ops) override {
    threads_.emplace_back([ops] {
      for (const TransferOp& op : ops) {
        std::memcpy(reinterpret_cast<void*>(op.remote_addr),
                    reinterpret_cast<const void*>(op.local_addr), op.length);
      }
    });
    return static_cast<CallId>(threads_.size() - 1);
  }
  Status wait(CallId call) override {
    threads_[call].join();
    return Status::Ok();
  }
  void cancel(CallId) override {}

 private:
  std::vector<std::thread> threads_;
};

TEST(Execute, EveryStrategyDeliversTheSameBytes) {
  MhaShape shape{.num_layers = 4,
                 .page_size_tokens = 4,
                 .kv_heads = 2,
                 .k_head_dim = 16,
                 .v_head_dim = 8,
                 .dtype_bytes = 2,
                 .num_pages = 32};
  testing::HostBuffer src_mem(*KvLayout::region_bytes(shape));
  src_mem.fill_random(1);
  std::vector<PageIndex> src_pages{3, 4, 5, 9, 10, 30, 0, 1};
  std::vector<PageIndex> dst_pages{7, 8, 9, 20, 21, 2, 14, 15};
  std::vector<uint8_t> expected;
  for (SendStrategy strategy : kAllSendStrategies) {
    for (uint32_t limit : {0u, 3u, 8u, 9u}) {
      if (strategy != SendStrategy::kIndexSharded && limit != 0) continue;
      testing::HostBuffer dst_mem(src_mem.data.size());
      dst_mem.fill_random(2);
      TransferPlan plan = *build_transfer_plan(
          *KvLayout::mha(shape, src_mem.base()), *KvLayout::mha(shape, dst_mem.base()), src_pages,
          dst_pages, {.strategy = strategy, .max_pages_per_call = limit});
      ThreadedCopySink sink;
      ASSERT_TRUE(execute(plan, sink).ok());
      if (expected.empty()) {
        expected = dst_mem.data;
        EXPECT_NE(expected, std::vector<uint8_t>(expected.size(), 0));
      }
      EXPECT_EQ(dst_mem.data, expected) << send_strategy_name(strategy) << " limit " << limit;
    }
  }
}

}  // namespace
}  // namespace kvferry::kv
