// HugeTableAllocator (core/mapped_memory.h): large tables in 2 MiB-aligned mappings of their own
// with huge pages asked for; small ones from the ordinary allocator; contents kept across
// growth from one to the other.
#include "core/mapped_memory.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kvferry {
namespace {

struct Row {
  uint64_t key = 0;
  std::string name;  // not trivially copyable: growth must move each row
  char pad[40] = {};
};

using Rows = std::vector<Row, HugeTableAllocator<Row>>;

bool huge_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kHugePageBytes == 0; }

// The VmFlags line of the mapping holding `p` in /proc/self/smaps, or "" if none holds it.
std::string vm_flags_of(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0;
    uintptr_t end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> start >> dash >> end && dash == '-') {
      inside = at >= start && at < end;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HugeTableAllocator, LargeTablesGetAlignedMappingsAskingForHugePages) {
  Rows rows;
  rows.reserve(HugeTables::kMinBytes / sizeof(Row) + 1);
  ASSERT_TRUE(huge_aligned(rows.data()));
  // The kernel records the request on the mapping ("hg"), where it has THP at all.
  if (std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    EXPECT_NE(vm_flags_of(rows.data()).find(" hg"), std::string::npos) << vm_flags_of(rows.data());
  }
}

TEST(HugeTableAllocator, SmallTablesComeFromTheOrdinaryAllocator) {
  Rows rows(16);
  EXPECT_EQ(vm_flags_of(rows.data()).find(" hg"), std::string::npos) << vm_flags_of(rows.data());
}

TEST(HugeTableAllocator, RowsSurviveGrowthFromSmallToHugeAndBack) {
  const size_t count = 3 * HugeTables::kMinBytes / sizeof(Row);
  Rows rows;
  for (size_t i = 0; i < count; ++i) rows.push_back({i, std::to_string(i), {}});
  ASSERT_TRUE(huge_aligned(rows.data()));
  Rows copy = rows;
  rows.resize(10);
  rows.shrink_to_fit();
  ASSERT_EQ(copy.size(), count);
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(copy[i].key, i);
    ASSERT_EQ(copy[i].name, std::to_string(i));
  }
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i].name, std::to_string(i));
}

TEST(MapMemory, HugePagesAlignedWritableAndWholeWhateverTheLength) {
  for (size_t bytes : {size_t{4096}, (size_t{3} << 20) + 4096, (size_t{6} << 20) + 1}) {
    void* p = map_memory(bytes, /*huge_pages=*/true);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_TRUE(huge_aligned(p)) << bytes;
    // A byte in every page, and the last one.
    auto* bytes_at = static_cast<unsigned char*>(p);
    auto value = [](size_t i) { return static_cast<unsigned char>((i >> 12) ^ (i & 0xff)); };
    for (size_t i = 0; i < bytes; i += 4096) bytes_at[i] = value(i);
    bytes_at[bytes - 1] = value(bytes - 1);
    for (size_t i = 0; i < bytes; i += 4096) ASSERT_EQ(bytes_at[i], value(i)) << bytes;
    EXPECT_EQ(bytes_at[bytes - 1], value(bytes - 1));
    unmap_memory(p, bytes);
  }
}

// The mapping of a returned buffer is gone once the buffer is freed: what a peer made this
// process hold does not stay resident (glibc would keep it at the top of an arena).
TEST(ReturnedAllocator, LargeBuffersAreMappingsOfTheirOwnUnmappedWhenFreed) {
  using Buffer = std::vector<std::byte, ReturnedAllocator<std::byte>>;
  Buffer small(ReturnedBuffers::kMinBytes - 1);
  Buffer large(ReturnedBuffers::kMinBytes);
  const void* where = large.data();
  EXPECT_FALSE(vm_flags_of(where).empty());
  large = Buffer();
  EXPECT_TRUE(vm_flags_of(where).empty()) << vm_flags_of(where);
  EXPECT_EQ(small.size(), ReturnedBuffers::kMinBytes - 1);
}

}  // namespace
}  // namespace kvferry
