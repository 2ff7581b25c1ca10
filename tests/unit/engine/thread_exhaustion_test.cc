// Thread exhaustion, as a process meets it under a cgroup's pids.max or RLIMIT_NPROC, or out
// of memory for a stack: the system refuses the thread a call would start on a peer's
// behalf (core/named_thread.h's seam stands in for the refusal). The call fails with a
// Status naming the thread, or its work goes to threads already running; the process goes
// on, nothing is half-open, and once threads start again the same calls succeed, every byte
// checked.
#include <gtest/gtest.h>

#include <vector>

#include "core/named_thread.h"
#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::contains;
using testing::make_engine;
using testing::must;

// Refuses the next start of a thread named `prefix`...; checks at the end of the scope that
// the scope did try to start one (the refusal was taken), and lets threads start again.
struct ThreadStartsRefused {
  explicit ThreadStartsRefused(const std::string& prefix) { refuse_next_thread_starts(1, prefix); }
  ~ThreadStartsRefused() {
    EXPECT_EQ(thread_start_refusals_left(), 0) << "no thread start was refused";
    refuse_next_thread_starts(0);
  }
};

struct TwoEngines {
  TwoEngines() : src(kBytes), dst(kBytes, std::byte{0}) {
    fill_pattern(src, 41);
    EXPECT_TRUE(a->register_memory(src.data(), src.size()).ok());
    EXPECT_TRUE(b->register_memory(dst.data(), dst.size()).ok());
  }
  // Writes src to b and checks every byte that arrived.
  void write_and_verify(const PeerHandle& peer) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    const TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), kBytes};
    ASSERT_TRUE(a->transfer_sync(peer, std::span(&op, 1)).ok());
    EXPECT_EQ(find_pattern_mismatch(dst, 41), std::nullopt);
  }
  static constexpr size_t kBytes = 256u << 10;
  std::unique_ptr<TransferEngine> a = make_engine("exhaust-a");
  std::unique_ptr<TransferEngine> b = make_engine("exhaust-b");
  std::vector<std::byte> src, dst;
};

// Opening a same-host peer starts the thread that watches peer processes: refused, the open
// fails naming it, and the next open watches the peer and moves the bytes.
TEST(ThreadExhaustion, OpenPeerFailsNamingTheThreadItCouldNotStartAndTheNextOpenWorks) {
  TwoEngines e;
  {
    ThreadStartsRefused refused("kvf-peer-mon");
    Result<PeerHandle> peer = e.a->open_peer(e.b->endpoint());
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), StatusCode::kInternal);
    EXPECT_TRUE(contains(peer.status().message(), "cannot start thread kvf-peer-mon"))
        << peer.status().to_string();
  }
  PeerHandle peer = must(e.a->open_peer(e.b->endpoint()));
  e.write_and_verify(peer);
}

// The tcp receiver starts its I/O thread with the first connection: refused, it closes the
// connection, the initiator's batch fails loudly (no hang), and the next batch connects and
// lands.
TEST(ThreadExhaustion, ATcpReceiverWithoutAThreadRefusesTheConnectionAndTheNextBatchLands) {
  TwoEngines e;
  PeerHandle peer = must(e.a->open_peer(e.b->endpoint(), {.transport = TransportKind::kTcp}));
  const TransferOp op{OpKind::kWrite, addr_of(e.src.data()), addr_of(e.dst.data()), e.kBytes};
  {
    ThreadStartsRefused refused("kvf-tcp-srv");
    Status s = e.a->transfer_sync(peer, std::span(&op, 1), {.timeout = std::chrono::seconds(10)});
    EXPECT_FALSE(s.ok());
  }
  e.write_and_verify(peer);
}

// A large local batch is split across the copy workers, started with the first such batch:
// refused, the submitting thread copies it all, and every byte lands.
TEST(ThreadExhaustion, ABatchWhoseCopyWorkersCannotStartIsCopiedByTheSubmitter) {
  auto engine = make_engine("exhaust-copy");
  constexpr size_t kBytes = 32u << 20;  // past inline_batch_bytes: the pool's work
  std::vector<std::byte> src(kBytes), dst(kBytes, std::byte{0});
  fill_pattern(src, 43);
  ASSERT_TRUE(engine->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(engine->register_memory(dst.data(), kBytes).ok());
  PeerHandle self = must(engine->open_peer(engine->endpoint()));
  const TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), kBytes};
  {
    ThreadStartsRefused refused("kvf-copy");
    ASSERT_TRUE(engine->transfer_sync(self, std::span(&op, 1)).ok());
  }
  EXPECT_EQ(testing::threads_named("kvf-copy"), 0u);
  EXPECT_EQ(find_pattern_mismatch(dst, 43), std::nullopt);
}

}  // namespace
}  // namespace kvferry
