// HostBuffer (tools/host_buffer.h): the tools' anonymous mapping, 2 MiB-aligned when huge
// pages are asked for, so no edge of it is left on 4 KiB pages.
#include "host_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvferry {
namespace {

void expect_usable(HostBuffer& b) {
  std::vector<char> pattern(b.size());
  std::mt19937 rng(7);
  for (char& c : pattern) c = static_cast<char>(rng());
  std::memcpy(b.data(), pattern.data(), pattern.size());
  EXPECT_EQ(std::memcmp(b.data(), pattern.data(), pattern.size()), 0);
}

TEST(HostBuffer, HugePagesStartOnA2MiBBoundaryWhateverTheLength) {
  // Lengths the kernel does not align by itself (not multiples of 2 MiB), and one it does.
  for (uint64_t bytes : {uint64_t{4096}, uint64_t{(3u << 20) + 4096}, uint64_t{(6u << 20) + 1},
                         uint64_t{8u << 20}}) {
    Result<HostBuffer> b = HostBuffer::map("test", bytes, /*huge_pages=*/true);
    ASSERT_TRUE(b.ok()) << b.status().to_string();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % kHugePageBytes, 0u) << bytes;
    EXPECT_EQ(b->size(), bytes);
    expect_usable(*b);
  }
}

TEST(HostBuffer, WithoutHugePagesItIsAPlainMapping) {
  Result<HostBuffer> b = HostBuffer::map("test", 12345, /*huge_pages=*/false);
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->size(), 12345u);
  expect_usable(*b);
}

}  // namespace
}  // namespace kvferry
