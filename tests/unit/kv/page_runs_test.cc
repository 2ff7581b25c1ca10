#include "kvferry/kv/page_runs.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

namespace kvferry::kv {
namespace {

std::vector<PageRun> runs_of(std::vector<PageIndex> src, std::vector<PageIndex> dst) {
  Result<std::vector<PageRun>> runs = group_page_runs(src, dst);
  EXPECT_TRUE(runs.ok()) << runs.status().to_string();
  return runs.ok() ? *runs : std::vector<PageRun>{};
}

TEST(PageRunGrouping, SplitsWhereEitherSideSkips) {
  EXPECT_EQ(runs_of({1, 2, 5}, {11, 12, 15}), (std::vector<PageRun>{{1, 11, 2}, {5, 15, 1}}));
}

TEST(PageRunGrouping, SplitsWhenOnlyTheDestinationSkips) {
  EXPECT_EQ(runs_of({1, 2, 3}, {11, 12, 14}), (std::vector<PageRun>{{1, 11, 2}, {3, 14, 1}}));
}

TEST(PageRunGrouping, SplitsWhenOnlyTheSourceSkips) {
  EXPECT_EQ(runs_of({1, 3, 4}, {11, 12, 13}), (std::vector<PageRun>{{1, 11, 1}, {3, 12, 2}}));
}

TEST(PageRunGrouping, ContiguousListsFormOneRun) {
  EXPECT_EQ(runs_of({0, 1, 2, 3, 4}, {10, 11, 12, 13, 14}), (std::vector<PageRun>{{0, 10, 5}}));
}

TEST(PageRunGrouping, PagesOneSideWalksDownOrRepeatsAreSeparateRuns) {
  EXPECT_EQ(runs_of({5, 4, 4}, {1, 2, 3}), (std::vector<PageRun>{{5, 1, 1}, {4, 2, 1}, {4, 3, 1}}));
  EXPECT_EQ(runs_of({1, 2, 3}, {13, 12, 11}),
            (std::vector<PageRun>{{1, 13, 1}, {2, 12, 1}, {3, 11, 1}}));
}

// vLLM's free queue hands a request's blocks back out last first: both lists walk down.
TEST(PageRunGrouping, PagesBothSidesWalkDownFormOneRunFromTheLowest) {
  EXPECT_EQ(runs_of({9, 8, 7, 6}, {23, 22, 21, 20}), (std::vector<PageRun>{{6, 20, 4}}));
  // Runs up and down, cut where either side turns or skips.
  EXPECT_EQ(runs_of({1, 2, 9, 8, 7, 3, 2}, {11, 12, 33, 32, 31, 40, 39}),
            (std::vector<PageRun>{{1, 11, 2}, {7, 31, 3}, {2, 39, 2}}));
}

TEST(PageRunGrouping, LargestPageNextToZeroIsACutNotAStep) {
  constexpr PageIndex kMax = std::numeric_limits<PageIndex>::max();
  EXPECT_EQ(runs_of({kMax, 0}, {kMax, 0}), (std::vector<PageRun>{{kMax, kMax, 1}, {0, 0, 1}}));
  EXPECT_EQ(runs_of({0, kMax}, {0, kMax}), (std::vector<PageRun>{{0, 0, 1}, {kMax, kMax, 1}}));
}

TEST(PageRunGrouping, EmptyListsGiveNoRuns) { EXPECT_TRUE(runs_of({}, {}).empty()); }

TEST(PageRunGrouping, UnequalListsAreInvalidArgumentNamingBothLengths) {
  std::vector<PageIndex> src{1, 2, 3}, dst{1};
  Result<std::vector<PageRun>> runs = group_page_runs(src, dst);
  ASSERT_FALSE(runs.ok());
  EXPECT_EQ(runs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(runs.status().message().find("src_pages has 3"), std::string::npos);
  EXPECT_NE(runs.status().message().find("dst_pages has 1"), std::string::npos);
}

}  // namespace
}  // namespace kvferry::kv
