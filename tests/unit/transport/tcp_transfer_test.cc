// The tcp transport between engines in one process (loopback), forced where shm would
// otherwise be chosen. Cross-process and failure cases are in tests/integration.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <span>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "mapped_pages.h"
#include "stalled_landing.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::addr_of;
using testing::contains;
using testing::must;
using testing::open_tcp;

// Tests declare their buffers before their engines, so the engines (and their I/O threads)
// end before the memory they registered is freed: its last use is then ordered before the
// free, also for ThreadSanitizer, which does not see the order a socket's bytes give.
std::unique_ptr<TransferEngine> engine_with(const std::string& name,
                                            std::optional<std::string> secret = std::nullopt) {
  EngineOptions o;
  o.name = name;
  o.secret = std::move(secret);
  return must(TransferEngine::create(o));
}

TEST(TcpTransfer, WriteAndReadArriveIntactAcrossLanes) {
  constexpr size_t kBytes = 40u << 20;  // ten 4 MiB chunks over two lanes
  std::vector<std::byte> src(kBytes), dst(kBytes, std::byte{0});
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  fill_pattern(src, 1);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), kBytes).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 1));
  fill_pattern(dst, 2);
  op.kind = OpKind::kRead;
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(src, 2));
}

size_t threads_of_this_process() {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                                           std::filesystem::directory_iterator{}));
}

// A lane has no thread of its own: an engine's threads do not grow with its tcp peers (each
// reached over every lane, by a striped WRITE and a small READ), only with the turns that
// run at once. The targets share this process: each starts its server's I/O threads with its
// first connections, so another engine reaches every target first.
TEST(TcpTransfer, TheInitiatorsThreadsStayFlatAsItsTcpPeersGrow) {
  constexpr size_t kPeers = 12;
  constexpr size_t kBytes = 4u << 20;  // striped over the four lanes
  constexpr size_t kReadBytes = 64u << 10;
  std::vector<std::vector<std::byte>> remote(kPeers, std::vector<std::byte>(kBytes));
  std::vector<std::byte> src(kBytes), back(kReadBytes);
  fill_pattern(src, 3);
  auto client = engine_with("flat-client");
  ASSERT_TRUE(client->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(client->register_memory(back.data(), back.size()).ok());
  std::vector<std::unique_ptr<TransferEngine>> targets;
  for (size_t i = 0; i < kPeers; ++i) {
    targets.push_back(engine_with("flat-target-" + std::to_string(i)));
    ASSERT_TRUE(targets.back()->register_memory(remote[i].data(), kBytes).ok());
  }
  auto warmer = engine_with("flat-warmer");
  ASSERT_TRUE(warmer->register_memory(src.data(), src.size()).ok());
  for (size_t i = 0; i < kPeers; ++i) {
    TransferOp write{OpKind::kWrite, addr_of(src.data()), addr_of(remote[i].data()), kBytes};
    ASSERT_TRUE(warmer->transfer_sync(open_tcp(*warmer, *targets[i]), {&write, 1}).ok());
  }
  size_t with_one_peer = 0;
  for (size_t i = 0; i < kPeers; ++i) {
    PeerHandle peer = open_tcp(*client, *targets[i]);
    TransferOp write{OpKind::kWrite, addr_of(src.data()), addr_of(remote[i].data()), kBytes};
    ASSERT_TRUE(client->transfer_sync(peer, {&write, 1}).ok());
    EXPECT_FALSE(find_pattern_mismatch(remote[i], 3)) << "peer " << i;
    fill_pattern(std::span(remote[i]).first(kReadBytes), 100 + i);
    TransferOp read{OpKind::kRead, addr_of(back.data()), addr_of(remote[i].data()), kReadBytes};
    ASSERT_TRUE(client->transfer_sync(peer, {&read, 1}).ok());
    EXPECT_FALSE(find_pattern_mismatch(back, 100 + i)) << "peer " << i;
    if (i == 0) with_one_peer = threads_of_this_process();
  }
  // Two threads per lane would add 88 here; a few workers may start for turns that overlap.
  EXPECT_LE(threads_of_this_process(), with_one_peer + 4)
      << "threads with one tcp peer: " << with_one_peer;
}

TEST(TcpTransfer, TenThousandSmallOpsArriveInTheirPlaces) {
  constexpr size_t kOps = 10'000, kOpBytes = 256;
  std::vector<std::byte> src(kOps * kOpBytes), dst(2 * kOps * kOpBytes, std::byte{0});
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  std::vector<size_t> slot(kOps);
  for (size_t i = 0; i < kOps; ++i) slot[i] = 2 * i;
  std::shuffle(slot.begin(), slot.end(), std::mt19937_64(3));
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    fill_pattern({src.data() + i * kOpBytes, kOpBytes}, 5, slot[i] * kOpBytes);
    ops.push_back({OpKind::kWrite, addr_of(src.data() + i * kOpBytes),
                   addr_of(dst.data() + slot[i] * kOpBytes), kOpBytes});
  }
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  BatchHandle b = must(prefill->submit(peer, ops));
  BatchStatus s = prefill->wait(b, std::chrono::seconds(30));
  ASSERT_EQ(s.state, BatchState::kCompleted) << s.status.to_string();
  EXPECT_EQ(s.telemetry.ops_posted, kOps);
  for (size_t k = 0; k < 2 * kOps; ++k) {
    std::span<const std::byte> piece{dst.data() + k * kOpBytes, kOpBytes};
    if (k % 2 == 0) {
      ASSERT_FALSE(find_pattern_mismatch(piece, 5, k * kOpBytes)) << "slot " << k;
    } else {
      ASSERT_EQ(std::count(piece.begin(), piece.end(), std::byte{0}), kOpBytes) << "slot " << k;
    }
  }
}

// A batch that is polled (status(), as NIXL's check_xfer_state does) rather than waited for:
// each poll takes in the answers that have arrived on the polling thread, racing the pool's
// reading turn once the waiter's grace is over. Small lone ops and striped 1 MiB ones,
// WRITEs and READs in turn; every byte of every round is checked.
TEST(TcpTransfer, BatchesPolledWithStatusRatherThanWaitedForCompleteWithEveryByteInPlace) {
  constexpr size_t kRounds = 60, kLarge = 1u << 20;
  std::vector<std::byte> local(kLarge), remote(kLarge);
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(local.data(), kLarge).ok());
  ASSERT_TRUE(decode->register_memory(remote.data(), kLarge).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  SubmitOptions options;
  options.timeout = std::chrono::seconds(20);
  for (size_t round = 0; round < kRounds; ++round) {
    const size_t bytes = round % 3 == 2 ? kLarge : 4096;
    const bool write = round % 2 == 0;
    const uint64_t seed = 100 + round;
    fill_pattern({(write ? local : remote).data(), bytes}, seed);
    TransferOp op{write ? OpKind::kWrite : OpKind::kRead, addr_of(local.data()),
                  addr_of(remote.data()), bytes};
    BatchHandle b = must(prefill->submit(peer, {&op, 1}, options));
    BatchStatus s = prefill->status(b);
    while (s.state == BatchState::kPending) {  // ends at the batch's timeout at the latest
      std::this_thread::yield();
      s = prefill->status(b);
    }
    ASSERT_EQ(s.state, BatchState::kCompleted) << "round " << round << ": " << s.status.to_string();
    EXPECT_FALSE(find_pattern_mismatch({(write ? remote : local).data(), bytes}, seed))
        << "round " << round;
  }
}

// Four threads submit small batches (each goes on one lane) at once, WRITEs and READs in
// turn: each batch takes an idle lane or shares a busy one, and waiters read answers that
// may be other batches'. Every byte of every batch is checked.
TEST(TcpTransfer, SmallBatchesFromSeveralThreadsAtOnceArriveIntact) {
  constexpr size_t kThreads = 4, kRounds = 40, kOps = 8, kOpBytes = 32 << 10;
  constexpr size_t kSlice = kOps * kOpBytes;  // one thread's share, 256 KiB
  std::vector<std::byte> local(kThreads * kSlice), remote(kThreads * kSlice);
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(local.data(), local.size()).ok());
  ASSERT_TRUE(decode->register_memory(remote.data(), remote.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::span<std::byte> mine{local.data() + t * kSlice, kSlice};
      std::span<std::byte> theirs{remote.data() + t * kSlice, kSlice};
      for (size_t round = 0; round < kRounds; ++round) {
        const uint64_t seed = 1000 * t + round;
        const OpKind kind = round % 2 == 0 ? OpKind::kWrite : OpKind::kRead;
        fill_pattern(kind == OpKind::kWrite ? mine : theirs, seed);
        std::vector<TransferOp> ops;
        for (size_t i = 0; i < kOps; ++i) {  // reversed at the peer: nothing merges
          ops.push_back({kind, addr_of(mine.data() + i * kOpBytes),
                         addr_of(theirs.data() + (kOps - 1 - i) * kOpBytes), kOpBytes});
        }
        Status s = prefill->transfer_sync(peer, ops);
        ASSERT_TRUE(s.ok()) << "thread " << t << " round " << round << ": " << s.to_string();
        const std::span<const std::byte> landed = kind == OpKind::kWrite ? theirs : mine;
        const std::span<const std::byte> sent = kind == OpKind::kWrite ? mine : theirs;
        for (size_t i = 0; i < kOps; ++i) {
          const size_t from = kind == OpKind::kWrite ? i : kOps - 1 - i;
          const size_t to = kind == OpKind::kWrite ? kOps - 1 - i : i;
          ASSERT_TRUE(std::equal(sent.begin() + from * kOpBytes,
                                 sent.begin() + (from + 1) * kOpBytes,
                                 landed.begin() + to * kOpBytes))
              << "thread " << t << " round " << round << " op " << i;
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
}

// READ sources that run on from each other at the peer in runs, with gaps, and some read
// twice: the receiver sends each run as one piece; every op still lands its own bytes.
TEST(TcpTransfer, ReadsOfAdjacentRepeatedAndScatteredSourcesLandInTheirPlaces) {
  constexpr size_t kSlots = 512, kOps = 600, kOpBytes = 1024;
  std::vector<std::byte> remote(kSlots * kOpBytes), local(kOps * kOpBytes, std::byte{0});
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  fill_pattern(remote, 7);
  std::mt19937_64 rng(11);
  std::vector<size_t> source;  // the remote slot op i reads
  while (source.size() < kOps) {
    size_t from = std::uniform_int_distribution<size_t>(0, kSlots - 1)(rng);
    const size_t run = std::uniform_int_distribution<size_t>(1, 12)(rng);
    for (size_t k = 0; k < run && from < kSlots && source.size() < kOps; ++k) {
      source.push_back(from++);
    }
  }
  std::vector<size_t> place(kOps);  // the local slot op i lands in
  for (size_t i = 0; i < kOps; ++i) place[i] = i;
  std::shuffle(place.begin(), place.end(), rng);
  std::vector<TransferOp> ops;
  for (size_t i = 0; i < kOps; ++i) {
    ops.push_back({OpKind::kRead, addr_of(local.data() + place[i] * kOpBytes),
                   addr_of(remote.data() + source[i] * kOpBytes), kOpBytes});
  }
  ASSERT_TRUE(prefill->register_memory(local.data(), local.size()).ok());
  ASSERT_TRUE(decode->register_memory(remote.data(), remote.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  ASSERT_TRUE(prefill->transfer_sync(peer, ops).ok());
  for (size_t i = 0; i < kOps; ++i) {
    std::span<const std::byte> got{local.data() + place[i] * kOpBytes, kOpBytes};
    ASSERT_FALSE(find_pattern_mismatch(got, 7, source[i] * kOpBytes))
        << "op " << i << " (remote slot " << source[i] << ")";
  }
}

TEST(TcpTransfer, ForcedTcpReachesTheEngineItself) {
  std::vector<std::byte> a(1 << 20), b(1 << 20, std::byte{0});
  auto engine = engine_with("self");
  fill_pattern(a, 9);
  ASSERT_TRUE(engine->register_memory(a.data(), a.size()).ok());
  ASSERT_TRUE(engine->register_memory(b.data(), b.size()).ok());
  PeerHandle peer = open_tcp(*engine, *engine);
  EXPECT_EQ(peer.transport(), TransportKind::kTcp);
  TransferOp op{OpKind::kWrite, addr_of(a.data()), addr_of(b.data()), a.size()};
  ASSERT_TRUE(engine->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(b, 9));
}

TEST(TcpTransfer, ReceiverRefusesARangeItNoLongerHasAndWritesNothing) {
  // A small write (its payload comes in the receiver's buffer with its header) and a large
  // one (after which the receiver reads headers alone: the refused payload is drained).
  for (const size_t bytes : {size_t{8192}, size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    std::vector<std::byte> src(bytes), dst(bytes, std::byte{0}), other(bytes, std::byte{0});
    auto prefill = engine_with("prefill");
    auto decode = engine_with("decode");
    fill_pattern(src, 4);
    ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
    ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
    PeerHandle peer = open_tcp(*prefill, *decode);  // caches the descriptor with dst in it
    ASSERT_TRUE(decode->unregister_memory(dst.data()).ok());
    TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), bytes};
    Status s = prefill->transfer_sync(peer, {&op, 1});
    EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
    EXPECT_EQ(static_cast<size_t>(std::count(dst.begin(), dst.end(), std::byte{0})), bytes);
    // The connection survives a refused request.
    ASSERT_TRUE(decode->register_memory(other.data(), other.size()).ok());
    op.remote_addr = addr_of(other.data());
    ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
    EXPECT_FALSE(find_pattern_mismatch(other, 4));
  }
}

// Ends every connection this process accepted (a listening socket's port is its local
// port) from under the receiver, as a dying peer's kernel does: a FIN (shutdown(SHUT_WR)),
// so the lane's reader sees the end while its sender is still sending (the receiver still
// reads). In a test with two engines that is the receiving engine's side of every lane.
void cut_accepted_connections() {
  std::vector<int> sockets;
  std::vector<uint16_t> listening;
  for (int fd = 0; fd < 4096; ++fd) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        local.sin_family != AF_INET) {
      continue;
    }
    int accepting = 0;
    socklen_t option_length = sizeof(accepting);
    if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &option_length) == 0 &&
        accepting != 0) {
      listening.push_back(local.sin_port);
    } else {
      sockets.push_back(fd);
    }
  }
  for (int fd : sockets) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
    if (std::find(listening.begin(), listening.end(), local.sin_port) != listening.end()) {
      ::shutdown(fd, SHUT_WR);
    }
  }
}

// Batches that end early — their peer goes away, or their deadline passes — while their
// bytes are moving: when wait() returns, no kvferry thread reads (a WRITE's sendmsg) or
// writes (a READ's payload) their local memory any more. Each batch's local slice is
// overwritten the moment its wait returns; a lane thread still in a syscall on it would be a
// data race that ThreadSanitizer reports (the unit tests run under TSan in CI). A batch that
// completed before its end has every byte in place.
enum class EarlyEnd { kPeerGone, kDeadline };

void reuse_memory_as_each_batch_ends(OpKind kind, EarlyEnd end) {
  constexpr size_t kBatches = 8, kSlice = 16u << 20;  // 4 MiB chunks, on every lane
  // One more slice for the warm-up. Declared before the engines: they outlive them.
  std::vector<std::byte> local((kBatches + 1) * kSlice), remote((kBatches + 1) * kSlice);
  std::vector<std::byte>& source = kind == OpKind::kWrite ? local : remote;
  std::vector<std::byte>& target = kind == OpKind::kWrite ? remote : local;
  fill_pattern({source.data(), kBatches * kSlice}, 11);
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(local.data(), local.size()).ok());
  ASSERT_TRUE(decode->register_memory(remote.data(), remote.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  // Every lane connected before the clock starts (lanes connect on first use, and under
  // TSan a handshake can outlast the 5 ms deadline): one 1 MiB READ per lane, 2 MiB apart in
  // the spare slice (a part above 512 KiB is striped in chunks of at least 1 MiB).
  const size_t spare = kBatches * kSlice;
  std::vector<TransferOp> warm;
  for (size_t i = 0; i < static_cast<size_t>(EngineOptions{}.tcp_lanes); ++i) {
    const size_t at = spare + i * (2u << 20);
    warm.push_back(
        {OpKind::kRead, addr_of(local.data() + at), addr_of(remote.data() + at), 1u << 20});
  }
  ASSERT_LE(static_cast<size_t>(EngineOptions{}.tcp_lanes) * (2u << 20), kSlice);
  ASSERT_TRUE(prefill->transfer_sync(peer, warm).ok());
  SubmitOptions options;
  options.timeout =
      end == EarlyEnd::kDeadline ? std::chrono::milliseconds(5) : std::chrono::milliseconds(30'000);
  std::vector<BatchHandle> batches;
  for (size_t i = 0; i < kBatches; ++i) {
    TransferOp op{kind, addr_of(local.data() + i * kSlice), addr_of(remote.data() + i * kSlice),
                  kSlice};
    batches.push_back(must(prefill->submit(peer, {&op, 1}, options)));
  }
  // 128 MiB take tens of milliseconds: the peer's connections break while they move.
  if (end == EarlyEnd::kPeerGone) cut_accepted_connections();
  size_t failed = 0;
  for (size_t i = 0; i < kBatches; ++i) {
    BatchStatus s = prefill->wait(batches[i], std::chrono::seconds(30));
    std::span<std::byte> mine{local.data() + i * kSlice, kSlice};
    if (s.state == BatchState::kFailed) {
      fill_pattern(mine, 99);  // at once: nothing of the engine may touch it now
      const StatusCode expected =
          end == EarlyEnd::kPeerGone ? StatusCode::kPeerDisconnected : StatusCode::kTimeout;
      EXPECT_EQ(s.status.code(), expected) << "batch " << i << ": " << s.status.to_string();
      ++failed;
      continue;
    }
    ASSERT_EQ(s.state, BatchState::kCompleted) << "batch " << i << " still pending";
    EXPECT_FALSE(find_pattern_mismatch({target.data() + i * kSlice, kSlice}, 11, i * kSlice))
        << "batch " << i;
    fill_pattern(mine, 99);
  }
  EXPECT_GT(failed, 0u);
}

TEST(TcpTransfer, AWriteWhosePeerGoesAwayIsDoneWithItsSourceWhenWaitReturns) {
  reuse_memory_as_each_batch_ends(OpKind::kWrite, EarlyEnd::kPeerGone);
}

TEST(TcpTransfer, AReadWhosePeerGoesAwayIsDoneWithItsTargetWhenWaitReturns) {
  reuse_memory_as_each_batch_ends(OpKind::kRead, EarlyEnd::kPeerGone);
}

TEST(TcpTransfer, AWritePastItsDeadlineIsDoneWithItsSourceWhenWaitReturns) {
  reuse_memory_as_each_batch_ends(OpKind::kWrite, EarlyEnd::kDeadline);
}

TEST(TcpTransfer, AReadPastItsDeadlineIsDoneWithItsTargetWhenWaitReturns) {
  reuse_memory_as_each_batch_ends(OpKind::kRead, EarlyEnd::kDeadline);
}

// A peer's tcp WRITE into registered memory the target made inaccessible without unregistering
// it: the write fails with NotRegistered, the target does not crash, and it keeps serving:
// the same ops into memory still mapped then arrive, every byte checked. `ops` ops of
// `op_bytes`, each followed by a gap of its size (so they are not merged; several small ones
// travel as one vector frame), into memory inaccessible from `gone_from` on.
void write_into_inaccessible_memory_then_into_mapped(size_t op_bytes, size_t ops,
                                                     size_t gone_from) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t span = (2 * op_bytes * ops + page - 1) / page * page;
  std::vector<std::byte> src(op_bytes * ops), kept(span, std::byte{0});
  fill_pattern(src, 21);
  testing::AnonymousPages gone(span);
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(gone.data(), gone.size()).ok());
  ASSERT_TRUE(decode->register_memory(kept.data(), kept.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  gone.take_away_from(gone_from);
  auto ops_into = [&](std::byte* target) {
    std::vector<TransferOp> out;
    for (size_t i = 0; i < ops; ++i) {
      out.push_back({OpKind::kWrite, addr_of(src.data() + i * op_bytes),
                     addr_of(target + 2 * i * op_bytes), op_bytes});
    }
    return out;
  };
  Status refused = prefill->transfer_sync(peer, ops_into(gone.data()));
  EXPECT_EQ(refused.code(), StatusCode::kNotRegistered) << refused.to_string();
  ASSERT_TRUE(prefill->transfer_sync(peer, ops_into(kept.data())).ok());
  for (size_t i = 0; i < ops; ++i) {
    std::span<const std::byte> landed{kept.data() + 2 * i * op_bytes, op_bytes};
    EXPECT_FALSE(find_pattern_mismatch(landed, 21, i * op_bytes)) << "op " << i;
    EXPECT_EQ(
        std::count(landed.end(), landed.end() + static_cast<ptrdiff_t>(op_bytes), std::byte{0}),
        static_cast<ptrdiff_t>(op_bytes))
        << "the gap after op " << i;
  }
}

TEST(TcpTransfer, ASmallWriteIntoMemoryTheTargetMadeInaccessibleIsAnErrorNotACrash) {
  write_into_inaccessible_memory_then_into_mapped(4096, 1, 0);  // copied from the receive buffer
}

TEST(TcpTransfer, ALargeWriteIntoMemoryTheTargetMadeInaccessibleIsAnErrorNotACrash) {
  // Striped over the lanes in chunks of at least 1 MiB: the last chunk's first half lands,
  // then the receive straight into its target meets the inaccessible part.
  write_into_inaccessible_memory_then_into_mapped(4u << 20, 1, (7u << 20) / 2);
}

TEST(TcpTransfer, AVectorWriteIntoMemoryTheTargetMadeInaccessibleIsAnErrorNotACrash) {
  write_into_inaccessible_memory_then_into_mapped(256, 16, 0);
  write_into_inaccessible_memory_then_into_mapped(4096, 64, 64u << 10);
}

TEST(TcpTransfer, AReadOfMemoryTheTargetMadeInaccessibleIsAnErrorNotACrash) {
  std::vector<std::byte> local(8192, std::byte{0}), kept(8192);
  fill_pattern(kept, 22);
  testing::AnonymousPages gone(8192);
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(local.data(), local.size()).ok());
  ASSERT_TRUE(decode->register_memory(gone.data(), gone.size()).ok());
  ASSERT_TRUE(decode->register_memory(kept.data(), kept.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  gone.take_away_from(0);
  TransferOp op{OpKind::kRead, addr_of(local.data()), addr_of(gone.data()), 8192};
  Status failed = prefill->transfer_sync(peer, {&op, 1});
  EXPECT_FALSE(failed.ok());
  // The receiver closed that connection (its answer's header may have been sent already) and
  // serves the next one.
  prefill->close_peer(peer);
  peer = open_tcp(*prefill, *decode);
  op.remote_addr = addr_of(kept.data());
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(local, 22));
}

// The tcp receiver's landing stalled mid-receive (straight into the target): a wait for
// landings begun meanwhile returns only after it landed (stalled_landing.h).
TEST(TcpTransfer, AWaitForLandingsBegunWhileAReceiveIsStalledReturnsOnlyAfterItLanded) {
  std::vector<std::byte> src(1u << 20);  // one piece, received straight into the target
  testing::AnonymousPages dst(2 * src.size());
  auto prefill = engine_with("prefill");
  auto decode = engine_with("decode");
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  testing::expect_wait_for_landings_outlasts_a_stalled_write(*prefill, peer, src, dst);
}

TEST(TcpAuthentication, MatchingSecretsMoveBytes) {
  std::vector<std::byte> src(4096), dst(4096, std::byte{0});
  auto prefill = engine_with("prefill", "s3cret");
  auto decode = engine_with("decode", "s3cret");
  fill_pattern(src, 8);
  ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  PeerHandle peer = open_tcp(*prefill, *decode);
  TransferOp op{OpKind::kWrite, addr_of(src.data()), addr_of(dst.data()), 4096};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 8));
}

TEST(TcpAuthentication, WrongOrMissingSecretIsRefusedAndNothingIsWritten) {
  std::vector<std::byte> dst(4096, std::byte{0});
  auto decode = engine_with("decode", "right");
  ASSERT_TRUE(decode->register_memory(dst.data(), dst.size()).ok());
  for (std::optional<std::string> secret :
       {std::optional<std::string>("wrong"), std::optional<std::string>()}) {
    std::vector<std::byte> src(4096, std::byte{1});
    auto prefill = engine_with("prefill", secret);
    ASSERT_TRUE(prefill->register_memory(src.data(), src.size()).ok());
    // The handshake refuses it the descriptor already (the tcp data plane's own check, for a
    // peer that learned the descriptor elsewhere, is tcp_hostile_test's).
    PeerOptions o;
    o.transport = TransportKind::kTcp;
    auto peer = prefill->open_peer(decode->endpoint(), o);
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.status().code(), StatusCode::kUnauthenticated) << peer.status().to_string();
    EXPECT_EQ(std::count(dst.begin(), dst.end(), std::byte{0}), 4096);
  }
}

TEST(TransportChoice, ForcedTcpNeedsThePeerToServeIt) {
  auto a = engine_with("a");
  EngineOptions o;
  o.name =
      std::string("b");  // not = "b": gcc 12 at -O3 reports a false -Wrestrict (GCC bug 105329)
  o.allowed_transports = TransportSet{TransportKind::kLocal, TransportKind::kShm};
  auto b = must(TransferEngine::create(o));
  PeerOptions force;
  force.transport = TransportKind::kTcp;
  auto r = a->open_peer(b->endpoint(), force);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotSupported);
  EXPECT_TRUE(contains(r.status().message(), "peer does not serve it")) << r.status().message();
}

}  // namespace
}  // namespace kvferry
