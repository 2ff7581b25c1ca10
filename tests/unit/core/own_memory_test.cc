#include "core/own_memory.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "core/pattern.h"
#include "mapped_pages.h"
#include "test_support.h"

namespace kvferry {
namespace {

using kvferry::testing::addr_of;
using kvferry::testing::contains;
const size_t kPage = kvferry::testing::kPageBytes;
using Pages = kvferry::testing::MappedPages;

// Pages of anonymous memory, some of which a test unmaps again (a hole in the address space).

TEST(MemoryMap, ListsReadableMappingsMergingNeighboursAndSkippingTheRest) {
  MemoryMap map = MemoryMap::parse(
      "1000-3000 rw-p 00000000 00:00 0\n"
      "3000-4000 r--p 00000000 08:01 42 /usr/lib/libc.so\n"
      "5000-6000 ---p 00000000 00:00 0\n"
      "6000-7000 r-xp 00000000 00:00 0 [vdso]\n"
      "garbage line\n"
      "7000-6000 rw-p 00000000 00:00 0\n");
  EXPECT_TRUE(map.readable(0x1000, 0x3000));  // two touching mappings read as one
  EXPECT_TRUE(map.readable(0x2fff, 2));
  EXPECT_FALSE(map.readable(0x3fff, 2));  // into the gap
  EXPECT_FALSE(map.readable(0x5000, 1));  // mapped, not readable
  EXPECT_TRUE(map.readable(0x6000, 0x1000));
  EXPECT_FALSE(map.readable(0x6000, 0x1001));
  EXPECT_FALSE(map.readable(0x0, 1));
  EXPECT_FALSE(map.readable(~uint64_t{0}, 2));  // wraps around
}

TEST(MemoryMap, OfThisProcessSeesMappedPagesButNotHolesOrUnreadablePages) {
  Pages pages(3);
  pages.unmap(1);
  ASSERT_EQ(::mprotect(pages.page(2), kPage, PROT_NONE), 0);
  std::vector<char> heap(100);
  MemoryMap map = MemoryMap::of_this_process();
  EXPECT_TRUE(map.readable(addr_of(heap.data()), heap.size()));
  EXPECT_TRUE(map.readable(addr_of(pages.page(0)), kPage));
  EXPECT_FALSE(map.readable(addr_of(pages.page(0)), kPage + 1));
  EXPECT_FALSE(map.readable(addr_of(pages.page(1)), 1));
  EXPECT_FALSE(map.readable(addr_of(pages.page(2)), 1));
  EXPECT_FALSE(map.readable(0x1000, 4096));
}

TEST(OwnMemoryCopy, FillsManyTargetsInOrder) {
  // More targets than one system call takes, of uneven lengths.
  std::vector<std::byte> source(200 * 37);
  fill_pattern(source, 3);
  std::vector<std::byte> target(2 * source.size(), std::byte{0});
  std::vector<iovec> targets;
  for (size_t i = 0; i < 200; ++i) targets.push_back({target.data() + 2 * i * 37, 37});
  ASSERT_TRUE(copy_to_own_memory(targets, source.data(), source.size()).ok());
  for (size_t i = 0; i < 200; ++i) {
    EXPECT_EQ(std::memcmp(target.data() + 2 * i * 37, source.data() + i * 37, 37), 0) << i;
    EXPECT_EQ(target[2 * i * 37 + 37], std::byte{0}) << i;  // the gaps stay untouched
  }
}

TEST(OwnMemoryCopy, AnUnmappedTargetIsAnErrorNamingItNotACrash) {
  Pages pages(2);
  pages.unmap(1);
  std::vector<std::byte> source(2 * kPage);
  fill_pattern(source, 5);
  const iovec both{pages.page(0), 2 * kPage};
  Status s = copy_to_own_memory({&both, 1}, source.data(), source.size());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), fmt::format("{:#x}", addr_of(pages.page(1))))) << s.message();
  EXPECT_TRUE(contains(s.message(), "not mapped writable")) << s.message();
  // What lies before the hole landed.
  EXPECT_FALSE(find_pattern_mismatch({pages.page(0), kPage}, 5));
}

TEST(OwnMemoryCopy, AReadOnlyTargetIsAnErrorAndKeepsItsBytes) {
  Pages pages(1);
  fill_pattern({pages.page(0), kPage}, 8);
  ASSERT_EQ(::mprotect(pages.page(0), kPage, PROT_READ), 0);
  std::vector<std::byte> source(kPage, std::byte{1});
  const iovec target{pages.page(0), kPage};
  EXPECT_EQ(copy_to_own_memory({&target, 1}, source.data(), kPage).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE(find_pattern_mismatch({pages.page(0), kPage}, 8));
}

TEST(OwnMemoryCopy, ReadsMappedMemoryAndRefusesAnUnmappedSource) {
  Pages pages(2);
  fill_pattern({pages.page(0), kPage}, 9);
  std::vector<std::byte> out(kPage);
  ASSERT_TRUE(copy_from_own_memory(out.data(), pages.page(0), kPage).ok());
  EXPECT_FALSE(find_pattern_mismatch(out, 9));
  pages.unmap(1);
  Status s = copy_from_own_memory(out.data(), pages.page(1), kPage);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(contains(s.message(), fmt::format("{:#x}", addr_of(pages.page(1))))) << s.message();
  EXPECT_EQ(copy_from_own_memory(out.data(), reinterpret_cast<const void*>(0x1000), 16).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvferry
