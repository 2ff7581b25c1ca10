// UcxLandingBuffers: reuse by size class, the idle limit, and the release of an idle pool.
#include "transport/ucx/ucx_landing_buffers.h"

#include <gtest/gtest.h>

#include <cstring>

namespace kvferry::detail {
namespace {

using Clock = UcxLandingBuffers::Clock;

TEST(UcxLandingBuffers, AReleasedBufferIsReusedForAPayloadOfItsSizeClass) {
  UcxLandingBuffers pool(size_t{64} << 20);
  const Clock::time_point t0 = Clock::now();
  char* first = nullptr;
  {
    UcxLandingBuffers::Lease lease = pool.acquire(size_t{1} << 20, t0);
    first = lease.data();
    std::memset(first, 0xab, size_t{1} << 20);  // the whole size is usable
  }
  EXPECT_EQ(pool.cached_bytes(), size_t{1} << 20);
  UcxLandingBuffers::Lease again = pool.acquire((size_t{1} << 20) - 100, t0);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  UcxLandingBuffers::Lease other = pool.acquire(size_t{1} << 20, t0);  // the class is empty
  EXPECT_NE(other.data(), first);
}

TEST(UcxLandingBuffers, KeepsNoMoreIdleThanItsLimit) {
  UcxLandingBuffers pool(size_t{3} << 20);
  const Clock::time_point t0 = Clock::now();
  {
    UcxLandingBuffers::Lease a = pool.acquire(size_t{2} << 20, t0);
    UcxLandingBuffers::Lease b = pool.acquire(size_t{2} << 20, t0);
    UcxLandingBuffers::Lease c = pool.acquire(1000, t0);  // the smallest class
  }
  // c (64 KiB) and one 2 MiB buffer fit under 3 MiB; the other 2 MiB was freed.
  EXPECT_EQ(pool.cached_bytes(), (size_t{2} << 20) + UcxLandingBuffers::kMinBytes);
}

TEST(UcxLandingBuffers, PayloadsLargerThanTheLargestClassAreNeverKept) {
  UcxLandingBuffers pool(size_t{64} << 20);
  { UcxLandingBuffers::Lease big = pool.acquire(UcxLandingBuffers::kMaxBytes + 1); }
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(UcxLandingBuffers, AnIdlePoolFreesEverythingAfterTheIdleRelease) {
  UcxLandingBuffers pool(size_t{64} << 20);
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(pool.release_if_idle(t0), Clock::time_point::max());  // nothing held
  { UcxLandingBuffers::Lease lease = pool.acquire(size_t{4} << 20, t0); }
  const Clock::time_point due = t0 + UcxLandingBuffers::kIdleRelease;
  EXPECT_EQ(pool.release_if_idle(t0 + std::chrono::milliseconds(10)), due);
  EXPECT_EQ(pool.cached_bytes(), size_t{4} << 20);
  EXPECT_EQ(pool.release_if_idle(due), Clock::time_point::max());
  EXPECT_EQ(pool.cached_bytes(), 0u);
}

TEST(UcxLandingBuffers, AMovedLeaseReturnsItsBufferOnce) {
  UcxLandingBuffers pool(size_t{64} << 20);
  {
    UcxLandingBuffers::Lease a = pool.acquire(100);
    UcxLandingBuffers::Lease b = std::move(a);
    UcxLandingBuffers::Lease c = pool.acquire(100);
    c = std::move(b);  // c's first buffer goes back now, b's when c goes
    EXPECT_EQ(pool.cached_bytes(), UcxLandingBuffers::kMinBytes);
  }
  EXPECT_EQ(pool.cached_bytes(), 2 * UcxLandingBuffers::kMinBytes);
}

}  // namespace
}  // namespace kvferry::detail
