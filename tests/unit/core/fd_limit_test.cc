// raise_open_files_limit (core/fd_limit.h): an engine talking to hundreds of peers needs more
// descriptors than the soft limit most processes start with; the first engine raises it.
#include "core/fd_limit.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>

namespace kvferry {
namespace {

// Puts the soft limit back as it was when the test started.
struct SoftLimitRestorer {
  rlimit saved{};
  SoftLimitRestorer() { ::getrlimit(RLIMIT_NOFILE, &saved); }
  ~SoftLimitRestorer() { ::setrlimit(RLIMIT_NOFILE, &saved); }
};

rlimit current() {
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  return l;
}

TEST(OpenFilesLimit, ALowSoftLimitIsRaisedToTheHardOneAndOnlyOnce) {
  SoftLimitRestorer restore;
  rlimit low = current();
  if (low.rlim_max != RLIM_INFINITY && low.rlim_max <= 512) GTEST_SKIP() << "hard limit too low";
  low.rlim_cur = 512;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);

  const auto change = raise_open_files_limit();
  ASSERT_TRUE(change.has_value());
  const uint64_t expected = std::min<uint64_t>(low.rlim_max, kMaxRaisedOpenFiles);
  EXPECT_EQ(change->from, 512u);
  EXPECT_EQ(change->to, expected);
  EXPECT_EQ(current().rlim_cur, expected);
  EXPECT_EQ(current().rlim_max, low.rlim_max);  // the hard limit is left alone

  EXPECT_FALSE(raise_open_files_limit().has_value());  // already there: nothing to do
  EXPECT_EQ(current().rlim_cur, expected);
}

}  // namespace
}  // namespace kvferry
