// CmaCopier and probe_cma against this process itself (process_vm_writev/readv to one's own
// pid is allowed) and against pids that are gone: bytes land exactly, errors are typed.
#include "transport/cma/cma_copier.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "core/pattern.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;

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
