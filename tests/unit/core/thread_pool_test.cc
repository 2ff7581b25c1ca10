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

#include "core/named_thread.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

using testing::threads_named;

TEST(ThreadPool, OneWorkerRunsTasksInTheOrderPosted) {
  std::vector<int> order;
  {
    ThreadPool pool(1, "kvf-tp-fifo");
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(pool.post([&order, i] { order.push_back(i); }).ok());
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
    ASSERT_TRUE(pool.post([&, released] {
                      ++running;
                      released.wait();
                      ++done;
                    })
                    .ok());
  }
  ASSERT_TRUE(testing::eventually([&] { return running.load() == 3; }, 10s));
  EXPECT_TRUE(testing::eventually([&] { return threads_named("kvf-tp-lazy") == 3; }, 10s));
  EXPECT_EQ(running.load(), 3);  // the other two wait for a worker, none is added
  release.set_value();
  ASSERT_TRUE(testing::eventually([&] { return done.load() == 5; }, 10s));
  EXPECT_EQ(threads_named("kvf-tp-lazy"), 3u);
}

// Exhaustion (the system will not start a thread; core/named_thread.h's seam stands in
// for it): a pool with no thread refuses the task, naming the thread, and runs nothing; a
// pool with threads queues the task for them; once threads start again, it grows.
TEST(ThreadPool, WhenNoThreadStartsAnEmptyPoolRefusesTheTaskAndAPoolWithThreadsQueuesIt) {
  ThreadPool pool(2, "kvf-tp-famine", ThreadPool::Start::kOnDemand);
  std::atomic<int> ran{0};
  refuse_next_thread_starts(1, "kvf-tp-famine");
  Status refused = pool.post([&] { ++ran; });
  EXPECT_EQ(refused.code(), StatusCode::kInternal);
  EXPECT_TRUE(testing::contains(refused.message(), "cannot start thread kvf-tp-famine-0"))
      << refused.to_string();

  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  ASSERT_TRUE(pool.post([&, released] {
                    released.wait();
                    ++ran;
                  })
                  .ok());
  EXPECT_TRUE(testing::eventually([&] { return threads_named("kvf-tp-famine") == 1; }, 10s));
  refuse_next_thread_starts(1, "kvf-tp-famine");  // the busy pool cannot grow: the task waits
  ASSERT_TRUE(pool.post([&] { ++ran; }).ok());
  EXPECT_EQ(threads_named("kvf-tp-famine"), 1u);
  release.set_value();
  EXPECT_TRUE(testing::eventually([&] { return ran.load() == 2; }, 10s)) << ran.load();
  refuse_next_thread_starts(0);
}

}  // namespace
}  // namespace kvferry
