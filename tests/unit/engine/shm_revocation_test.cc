// No completion without data on shm: a peer that mapped a shared allocation keeps its
// mapping after the owner unregisters or frees it, so the writer checks the allocation's
// guard word (transport/shm_mapping.h) before posting and after every copy. Batches
// submitted after free_shared / unregister_memory returned fail with NotRegistered and
// write nothing; a region registered again (or a new allocation at the same address) is
// found by refreshing the descriptor, and its bytes arrive.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::make_engine;
using testing::must;

constexpr size_t kSharedBytes = 1 << 20;
constexpr size_t kOpBytes = 64 << 10;

bool is_revoked(StatusCode code) {
  return code == StatusCode::kNotRegistered || code == StatusCode::kPeerDisconnected;
}

// Writes 64 KiB pieces of `src` into the peer's `target` until told to stop (bounded),
// counting the outcomes of batches submitted after `revoked` was set.
class Writer {
 public:
  Writer(TransferEngine& engine, PeerHandle peer, const std::byte* src, uint64_t target)
      : engine_(engine), peer_(std::move(peer)), src_(src), target_(target) {
    thread_ = std::thread([this] { run(); });
  }
  ~Writer() { stop(); }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Waits (bounded) until `n` batches completed before the revocation.
  bool wait_for_completed(int n) {
    for (int i = 0; i < 10'000 && completed_before_.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return completed_before_.load() >= n;
  }
  // Marks the revocation done, then waits until `n` batches were submitted after it.
  bool revoked_then_wait_for(int n) {
    revoked_ = true;
    for (int i = 0; i < 10'000 && after_.load() < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return after_.load() >= n;
  }
  int after() const { return after_.load(); }
  int completed_after() const { return completed_after_.load(); }
  int unexpected_after() const { return unexpected_after_.load(); }

 private:
  void run() {
    constexpr int kMaxBatches = 200'000;  // bounded whatever happens
    for (int i = 0; i < kMaxBatches && !stop_; ++i) {
      const size_t offset = (static_cast<size_t>(i) * kOpBytes) % kSharedBytes;
      TransferOp op{OpKind::kWrite, addr_of(src_ + offset), target_ + offset, kOpBytes};
      const bool after = revoked_.load();  // read before submit: the batch is "later"
      Result<BatchHandle> batch = engine_.submit(peer_, {&op, 1});
      Status outcome =
          batch.ok() ? engine_.wait(*batch, std::chrono::seconds(5)).status : batch.status();
      if (!after) {
        if (outcome.ok()) ++completed_before_;
        continue;
      }
      ++after_;
      if (outcome.ok()) {
        ++completed_after_;
      } else if (!is_revoked(outcome.code())) {
        ++unexpected_after_;
      }
    }
  }
  TransferEngine& engine_;
  PeerHandle peer_;
  const std::byte* src_;
  uint64_t target_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> revoked_{false};
  std::atomic<int> completed_before_{0};
  std::atomic<int> after_{0};
  std::atomic<int> completed_after_{0};
  std::atomic<int> unexpected_after_{0};
  std::thread thread_;
};

struct Pair {
  std::unique_ptr<TransferEngine> prefill = make_engine("prefill");
  std::unique_ptr<TransferEngine> decode = make_engine("decode");
  std::vector<std::byte> src = std::vector<std::byte>(kSharedBytes);
  Pair() {
    fill_pattern(src, 17);
    EXPECT_TRUE(prefill->register_memory(src.data(), kSharedBytes).ok());
  }
};

TEST(ShmRevocation, FreeSharedUnderWritesFailsEveryLaterBatch) {
  Pair p;
  SharedBuffer target = must(p.decode->allocate_shared(kSharedBytes));
  PeerHandle peer = must(p.prefill->open_peer(p.decode->endpoint()));
  ASSERT_EQ(peer.transport(), TransportKind::kShm);
  Writer writer(*p.prefill, peer, p.src.data(), addr_of(target.addr));
  ASSERT_TRUE(writer.wait_for_completed(20));
  ASSERT_TRUE(p.decode->free_shared(target.addr).ok());
  ASSERT_TRUE(writer.revoked_then_wait_for(200));
  writer.stop();
  // Before the guard word, every one of these reported Completed with its bytes in a memfd
  // nobody reads any more.
  EXPECT_EQ(writer.completed_after(), 0) << "of " << writer.after() << " later batches";
  EXPECT_EQ(writer.unexpected_after(), 0);
}

TEST(ShmRevocation, UnregisterUnderWritesFailsLaterBatchesAndWritesNothing) {
  Pair p;
  SharedBuffer target = must(p.decode->allocate_shared(kSharedBytes));
  PeerHandle peer = must(p.prefill->open_peer(p.decode->endpoint()));
  std::span<std::byte> memory(static_cast<std::byte*>(target.addr), kSharedBytes);
  {
    Writer writer(*p.prefill, peer, p.src.data(), addr_of(target.addr));
    ASSERT_TRUE(writer.wait_for_completed(20));
    ASSERT_TRUE(p.decode->unregister_memory(target.addr).ok());
    ASSERT_TRUE(writer.revoked_then_wait_for(100));
    writer.stop();
    EXPECT_EQ(writer.completed_after(), 0) << "of " << writer.after() << " later batches";
    EXPECT_EQ(writer.unexpected_after(), 0);
  }
  // The memory is still mapped on both sides: later batches must not write it.
  std::fill(memory.begin(), memory.end(), std::byte{0});
  TransferOp op{OpKind::kWrite, addr_of(p.src.data()), addr_of(target.addr), kSharedBytes};
  for (int i = 0; i < 20; ++i) {
    Status s = p.prefill->transfer_sync(peer, {&op, 1});
    EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  }
  EXPECT_TRUE(std::all_of(memory.begin(), memory.end(), [](std::byte b) {
    return b == std::byte{0};
  })) << "a batch refused as NotRegistered wrote bytes";
  // Registered again: the writer refreshes the descriptor and the bytes arrive.
  ASSERT_TRUE(p.decode->register_memory(target.addr, kSharedBytes).ok());
  ASSERT_TRUE(p.prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(memory, 17));
}

TEST(ShmRevocation, NewAllocationAtAFreedAddressGetsTheBytesOrAnError) {
  Pair p;
  SharedBuffer first = must(p.decode->allocate_shared(kSharedBytes));
  PeerHandle peer = must(p.prefill->open_peer(p.decode->endpoint()));
  TransferOp op{OpKind::kWrite, addr_of(p.src.data()), addr_of(first.addr), kSharedBytes};
  ASSERT_TRUE(p.prefill->transfer_sync(peer, {&op, 1}).ok());
  ASSERT_TRUE(p.decode->free_shared(first.addr).ok());
  SharedBuffer second = must(p.decode->allocate_shared(kSharedBytes));  // often the same address
  std::span<std::byte> memory(static_cast<std::byte*>(second.addr), kSharedBytes);
  Status s = p.prefill->transfer_sync(peer, {&op, 1});
  if (second.addr != first.addr) {
    EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
    return;
  }
  // Same address, another memfd: completion means the bytes are in the new allocation
  // (the writer saw the old guard revoked, refreshed the descriptor and mapped the new one).
  ASSERT_TRUE(s.ok() || is_revoked(s.code())) << s.to_string();
  if (!s.ok()) {
    ASSERT_TRUE(p.prefill->transfer_sync(peer, {&op, 1}).ok());
  }
  EXPECT_FALSE(find_pattern_mismatch(memory, 17));
}

}  // namespace
}  // namespace kvferry
