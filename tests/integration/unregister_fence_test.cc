// Attack class: a write after unregister (stale descriptor). sglang and vLLM unregister and
// reuse pools; a same-host initiator that still holds the old descriptor must not land a
// byte in memory whose registration has ended — on any transport, cma included, where the
// target runs nothing while the bytes move. The target keeps the memory mapped after
// unregister_memory (the worst case: nothing faults), and every byte of it is checked.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;

constexpr uint64_t kFenceRegionBytes = 1 << 20;

// ucx here has only UCX's emulated paths (tcp, shared memory), which carry kvferry's checked
// active messages once allowed.
std::unique_ptr<TransferEngine> engine_for(const std::string& name, TransportKind route) {
  EngineOptions options;
  options.name = name;
  options.ucx_allow_emulated = route == TransportKind::kUcx;
  return must(TransferEngine::create(options));
}

struct Target {
  explicit Target(TransportKind route) : engine(engine_for("target", route)) {
    if (route == TransportKind::kShm) {
      SharedBuffer shared = must(engine->allocate_shared(kFenceRegionBytes));
      bytes = static_cast<std::byte*>(shared.addr);
    } else {
      plain.resize(kFenceRegionBytes);
      bytes = plain.data();
      EXPECT_TRUE(engine->register_memory(bytes, kFenceRegionBytes).ok());
    }
  }
  std::unique_ptr<TransferEngine> engine;
  std::vector<std::byte> plain;  // host memory (cma, tcp); shm uses allocate_shared memory
  std::byte* bytes = nullptr;
};

class UnregisterFence : public ::testing::TestWithParam<TransportKind> {};

TEST_P(UnregisterFence, AWriteAfterUnregisterReturnedFailsAndLandsNothing) {
  const TransportKind route = GetParam();
  Target target(route);
  auto initiator = engine_for("initiator", route);
  std::vector<std::byte> src(kFenceRegionBytes);
  fill_pattern(src, 17);
  ASSERT_TRUE(initiator->register_memory(src.data(), kFenceRegionBytes).ok());
  PeerOptions options;
  options.transport = route;
  PeerHandle peer = must(initiator->open_peer(target.engine->endpoint(), options));
  ASSERT_EQ(peer.transport(), route);
  const TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                      reinterpret_cast<uint64_t>(target.bytes), kFenceRegionBytes};
  // While registered, the write lands whole.
  ASSERT_TRUE(initiator->transfer_sync(peer, {&op, 1}).ok());
  ASSERT_TRUE(std::equal(src.begin(), src.end(), target.bytes));

  ASSERT_TRUE(target.engine->unregister_memory(target.bytes).ok());
  std::fill(target.bytes, target.bytes + kFenceRegionBytes,
            std::byte{0xEE});  // the pool's new owner
  fill_pattern(src, 18);
  // Twice: the first attempt may refresh the descriptor, the second runs on what it learnt.
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<BatchHandle> batch = initiator->submit(peer, {&op, 1});
    if (batch.ok()) {
      BatchStatus done = initiator->wait(*batch, std::chrono::seconds(30));
      EXPECT_NE(done.state, BatchState::kCompleted) << "a write after unregister completed";
      EXPECT_FALSE(done.status.ok());
    }
  }
  EXPECT_TRUE(std::all_of(target.bytes, target.bytes + kFenceRegionBytes, [](std::byte b) {
    return b == std::byte{0xEE};
  })) << "bytes landed in memory whose registration had ended";
}

// Every transport that carries host memory in this build.
std::vector<TransportKind> host_transports() {
  std::vector<TransportKind> kinds = {TransportKind::kCma, TransportKind::kShm,
                                      TransportKind::kTcp};
#ifdef KVFERRY_WITH_UCX
  kinds.push_back(TransportKind::kUcx);
#endif
  return kinds;
}

INSTANTIATE_TEST_SUITE_P(EveryHostTransport, UnregisterFence,
                         ::testing::ValuesIn(host_transports()), [](const auto& param_info) {
                           return std::string(transport_kind_name(param_info.param));
                         });

}  // namespace
}  // namespace kvferry
