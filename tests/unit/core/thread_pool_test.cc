// ThreadPool: every task runs, in FIFO order on one worker; a pool started on demand holds no
// thread until a task comes, starts one per task that finds every worker busy, up to its
// size, and runs what is queued before it goes.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <mutex>
#include <string>
#include <vector>

#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

using testing::threads_named;

TEST(ThreadPool, OneWorkerRunsTasksInTheOrderPosted) {
  std::vector<int> order;
  {
    ThreadPool pool(1, "kvf-tp-fifo");
    for (int i = 0; i < 100; ++i) pool.post([&order, i] { order.push_back(i); });
  }  // the destructor runs what is queued
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(ThreadPool, OnDemandStartsNoThreadUntilATaskComesAndNoMoreThanItsSize) {
  ThreadPool pool(3, "kvf-tp-lazy", ThreadPool::Start::kOnDemand);
  EXPECT_EQ(pool.size(), 3);
  EXPECT_EQ(threads_named("kvf-tp-lazy"), 0u);
  // Five tasks that block until released: three run at once (one thread each), two wait.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> running{0};
  std::atomic<int> done{0};
  for (int i = 0; i < 5; ++i) {
    pool.post([&, released] {
      ++running;
      released.wait();
      ++done;
    });
  }
  ASSERT_TRUE(testing::eventually([&] { return running.load() == 3; }, 10s));
  EXPECT_TRUE(testing::eventually([&] { return threads_named("kvf-tp-lazy") == 3; }, 10s));
  EXPECT_EQ(running.load(), 3);  // the other two wait for a worker, none is added
  release.set_value();
  ASSERT_TRUE(testing::eventually([&] { return done.load() == 5; }, 10s));
  EXPECT_EQ(threads_named("kvf-tp-lazy"), 3u);
}

}  // namespace
}  // namespace kvferry
