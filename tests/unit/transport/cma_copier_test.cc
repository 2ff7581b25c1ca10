// CmaCopier and probe_cma against this process itself (process_vm_writev/readv to one's own
// pid is allowed) and against pids that are gone: bytes land exactly, errors are typed.
#include "transport/cma/cma_copier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

ResolvedOp op(OpKind kind, std::byte* local, std::byte* remote, uint64_t length) {
  return ResolvedOp{kind, reinterpret_cast<char*>(local), reinterpret_cast<uint64_t>(remote),
                    nullptr, length};
}

// A pid that no longer names a process: a child that exited and was reaped.
pid_t gone_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(CmaCopier, MixedWriteAndReadPiecesLandExactly) {
  std::vector<std::byte> a(64 << 10), b(64 << 10), back(64 << 10);
  fill_pattern(a, 1);
  fill_pattern(b, 2);
  // WRITE a[0, 32K) -> b[32K, 64K) in two pieces of one span (offsets), then READ b[0, 4K).
  std::vector<ResolvedOp> spans = {op(OpKind::kWrite, a.data(), b.data() + (32 << 10), 32 << 10),
                                   op(OpKind::kRead, back.data(), b.data(), 4096)};
  const std::vector<CopyPiece> pieces = {
      {&spans[0], 0, 1000}, {&spans[0], 1000, (32 << 10) - 1000}, {&spans[1], 0, 4096}};
  CmaCopier copier(::getpid(), "self");
  ASSERT_TRUE(copier.copy_chunk(pieces).ok());
  EXPECT_FALSE(find_pattern_mismatch({b.data() + (32 << 10), 32 << 10}, 1, 0));
  EXPECT_FALSE(find_pattern_mismatch({b.data(), 32 << 10}, 2, 0));  // untouched half
  EXPECT_FALSE(find_pattern_mismatch({back.data(), 4096}, 2, 0));
}

TEST(CmaCopier, EveryPieceOfAFullChunkOfScatteredSpansLands) {
  constexpr size_t kPieces = kMaxChunkPieces;  // the most one chunk hands over
  std::vector<std::byte> src(kPieces * 64), dst(kPieces * 64);
  fill_pattern(src, 3);
  std::vector<ResolvedOp> spans;
  for (size_t i = 0; i < kPieces; ++i) {
    // Reversed destinations: nothing is contiguous.
    spans.push_back(
        op(OpKind::kWrite, src.data() + i * 64, dst.data() + (kPieces - 1 - i) * 64, 64));
  }
  std::vector<CopyPiece> pieces;
  for (const ResolvedOp& s : spans) pieces.push_back({&s, 0, 64});
  ASSERT_TRUE(CmaCopier(::getpid(), "self").copy_chunk(pieces).ok());
  for (size_t i = 0; i < kPieces; ++i) {
    ASSERT_FALSE(find_pattern_mismatch({dst.data() + (kPieces - 1 - i) * 64, 64}, 3, i * 64))
        << "piece " << i;
  }
}

// The copier hands the kernel the pieces in the peer's address order, merging pieces adjacent
// there into one remote range: runs of adjacent, shuffled and gapped peer ranges, pieces of
// random lengths scattered here, WRITE and READ, land byte for byte and nothing between them
// is touched.
TEST(CmaCopier, PiecesInAnyOrderLandExactlyAndLeaveTheGapsAlone) {
  std::mt19937 rng(7);
  constexpr size_t kPieces = kMaxChunkPieces;
  std::vector<uint64_t> lengths(kPieces);
  for (uint64_t& l : lengths) l = 1 + rng() % 300;
  // Peer layout: in slot order, runs of 1..8 adjacent pieces separated by 1..64-byte gaps.
  std::vector<uint64_t> peer_off(kPieces);
  uint64_t at = 0;
  for (size_t k = 0; k < kPieces; ++k) {
    if (rng() % 4 == 0) at += 1 + rng() % 64;
    peer_off[k] = at;
    at += lengths[k];
  }
  const uint64_t peer_bytes = at + 64;
  // Local side: each piece in its own place, in a shuffled order, with gaps.
  std::vector<size_t> perm(kPieces);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<uint64_t> local_off(kPieces);
  at = 0;
  for (size_t k : perm) {
    local_off[k] = at;
    at += lengths[k] + 1 + rng() % 16;
  }
  const uint64_t local_bytes = at;
  for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
    SCOPED_TRACE(kind == OpKind::kWrite ? "write" : "read");
    std::vector<std::byte> here(local_bytes), peer(peer_bytes);
    std::vector<std::byte>& from = kind == OpKind::kWrite ? here : peer;
    std::vector<std::byte>& to = kind == OpKind::kWrite ? peer : here;
    fill_pattern(from, 11);
    fill_pattern(to, 12);
    const std::vector<std::byte> before = to;
    std::vector<ResolvedOp> spans;
    for (size_t k : perm) {  // the batch's op order is the shuffled one
      spans.push_back(op(kind, here.data() + local_off[k], peer.data() + peer_off[k], lengths[k]));
    }
    std::vector<CopyPiece> pieces;
    for (const ResolvedOp& s : spans) pieces.push_back({&s, 0, s.length});
    ASSERT_TRUE(CmaCopier(::getpid(), "self").copy_chunk(pieces).ok());
    std::vector<std::byte> expected = before;
    const std::vector<uint64_t>& from_off = kind == OpKind::kWrite ? local_off : peer_off;
    const std::vector<uint64_t>& to_off = kind == OpKind::kWrite ? peer_off : local_off;
    for (size_t k = 0; k < kPieces; ++k) {
      std::memcpy(expected.data() + to_off[k], from.data() + from_off[k], lengths[k]);
    }
    ASSERT_EQ(to, expected);
  }
}

TEST(CmaCopier, AnUnmappedPeerRangeIsNotRegisteredAfterThePartThatFits) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = ::mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(map, MAP_FAILED);
  auto* target = static_cast<std::byte*>(map);
  ASSERT_EQ(::mprotect(target + page, page, PROT_NONE), 0);
  std::vector<std::byte> src(2 * page);
  fill_pattern(src, 4);
  std::vector<ResolvedOp> spans = {op(OpKind::kWrite, src.data(), target, 2 * page)};
  const std::vector<CopyPiece> pieces = {{&spans[0], 0, 2 * page}};
  Status s = CmaCopier(::getpid(), "self").copy_chunk(pieces);
  EXPECT_EQ(s.code(), StatusCode::kNotRegistered) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "not mapped in the peer")) << s.message();
  // The kernel moved the first page before it stopped.
  EXPECT_FALSE(find_pattern_mismatch({target, page}, 4, 0));
  ::munmap(map, 2 * page);
}

TEST(CmaCopier, APeerThatExitedIsPeerDisconnected) {
  std::vector<std::byte> a(4096), b(4096);
  std::vector<ResolvedOp> spans = {op(OpKind::kWrite, a.data(), b.data(), 4096)};
  const std::vector<CopyPiece> pieces = {{&spans[0], 0, 4096}};
  Status s = CmaCopier(gone_pid(), "gone").copy_chunk(pieces);
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "has exited")) << s.message();
}

// A child that idles until killed (or, at the latest, for 60 s): after fork it holds a copy of
// the parent's memory at the same addresses, so the parent's buffers name its own.
pid_t idle_child() {
  const pid_t child = ::fork();
  if (child == 0) {
    ::alarm(60);
    for (;;) ::pause();
  }
  return child;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

TEST(CmaCopier, APeerKilledAndReapedFailsTheNextChunkThroughItsPidfd) {
  std::vector<std::byte> a(64 << 10), b(64 << 10, std::byte{0}), back(64 << 10);
  fill_pattern(a, 5);
  const pid_t child = idle_child();
  ASSERT_GT(child, 0);
  CmaCopier copier(child, "child", must(open_cma_pidfd(child, "child")));
  // Into the child's copy of b, then back out of it: every byte verified.
  std::vector<ResolvedOp> spans = {op(OpKind::kWrite, a.data(), b.data(), a.size()),
                                   op(OpKind::kRead, back.data(), b.data(), b.size())};
  const std::vector<CopyPiece> pieces = {{&spans[0], 0, a.size()}, {&spans[1], 0, b.size()}};
  ASSERT_TRUE(copier.copy_chunk(pieces).ok());
  EXPECT_FALSE(find_pattern_mismatch(back, 5));
  EXPECT_TRUE(std::all_of(b.begin(), b.end(), [](std::byte x) { return x == std::byte{0}; }));
  EXPECT_TRUE(copier.check_alive().ok());
  kill_and_reap(child);
  Status s = copier.copy_chunk(pieces);
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
  EXPECT_TRUE(contains(s.message(), "has exited")) << s.message();
  EXPECT_TRUE(contains(s.message(), "another process")) << s.message();
}

TEST(CmaCopier, APidNowHeldByAnotherProcessIsNeverWrittenInto) {
  // Pid reuse cannot be forced; what it amounts to can: the copier's pidfd is of a process
  // that exited and was reaped, its pid that of another live process (of the same user).
  const pid_t first = idle_child();
  ASSERT_GT(first, 0);
  Fd first_pidfd = must(open_cma_pidfd(first, "first"));
  kill_and_reap(first);
  std::vector<std::byte> a(4096), b(4096, std::byte{0}), back(4096, std::byte{1});
  fill_pattern(a, 6);
  const pid_t second = idle_child();
  ASSERT_GT(second, 0);
  CmaCopier stale(second, "first", std::move(first_pidfd));
  std::vector<ResolvedOp> spans = {op(OpKind::kWrite, a.data(), b.data(), a.size())};
  const std::vector<CopyPiece> pieces = {{&spans[0], 0, a.size()}};
  Status s = stale.copy_chunk(pieces);
  EXPECT_EQ(s.code(), StatusCode::kPeerDisconnected) << s.to_string();
  // The other process's memory is untouched (read through a copier of its own).
  CmaCopier own(second, "second", must(open_cma_pidfd(second, "second")));
  std::vector<ResolvedOp> read_spans = {op(OpKind::kRead, back.data(), b.data(), b.size())};
  const std::vector<CopyPiece> read_pieces = {{&read_spans[0], 0, b.size()}};
  ASSERT_TRUE(own.copy_chunk(read_pieces).ok());
  EXPECT_TRUE(std::all_of(back.begin(), back.end(), [](std::byte x) { return x == std::byte{0}; }));
  kill_and_reap(second);
}

TEST(CmaCopier, OpeningThePidfdOfAGonePidIsPeerDisconnected) {
  auto fd = open_cma_pidfd(gone_pid(), "gone");
  ASSERT_FALSE(fd.ok());
  EXPECT_EQ(fd.status().code(), StatusCode::kPeerDisconnected) << fd.status().to_string();
  EXPECT_TRUE(contains(fd.status().message(), "pid")) << fd.status().message();
}

TEST(CmaProbe, PermitsThisProcessAndNamesWhyOthersAreRefused) {
  std::vector<std::byte> region(64);
  EXPECT_EQ(probe_cma(::getpid(), reinterpret_cast<uint64_t>(region.data())), "");
  EXPECT_EQ(probe_cma(::getpid(), std::nullopt), "");  // EFAULT at 0: the kernel let us in
  EXPECT_TRUE(contains(probe_cma(::getpid(), 8), "faulted")) << probe_cma(::getpid(), 8);
  const std::string gone = probe_cma(gone_pid(), std::nullopt);
  EXPECT_TRUE(contains(gone, "ESRCH")) << gone;
  EXPECT_TRUE(contains(probe_cma(0, std::nullopt), "no usable pid"));
}

}  // namespace
}  // namespace kvferry
