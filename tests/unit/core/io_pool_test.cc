// IoPool: tasks and watched descriptors run on whichever worker the kernel wakes; a watch fires
// once per arm; a callback that blocks never holds up the others (a worker is started for
// them) and the extra workers end once idle; the timer runs when asked, earlier when woken;
// the pool may be destroyed by one of its own callbacks.
#include "core/io_pool.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "core/fd.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using ::kvferry::testing::eventually;

std::unique_ptr<IoPool> make_pool(std::chrono::milliseconds idle_exit = 2000ms) {
  IoPool::Options o;
  o.name = "kvf-test-io";
  o.idle_exit = idle_exit;
  auto pool = IoPool::create(o);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

// Runs a task on the pool and waits for it: every event queued before it has been taken.
void drain(IoPool& pool) {
  std::promise<void> done;
  pool.post([&] { done.set_value(); });
  ASSERT_EQ(done.get_future().wait_for(10s), std::future_status::ready);
}

// Two connected stream sockets (both invalid if they cannot be made).
std::pair<Fd, Fd> connected_pair() {
  int pair[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return {};
  return {Fd(pair[0]), Fd(pair[1])};
}

TEST(IoPool, RunsEveryPostedTask) {
  auto pool = make_pool();
  std::atomic<int> ran{0};
  for (int i = 0; i < 1000; ++i) pool->post([&] { ran.fetch_add(1); });
  EXPECT_TRUE(eventually([&] { return ran.load() == 1000; }, 10s)) << ran.load();
}

TEST(IoPool, AWatchFiresOncePerArmNotWhileTheInputWaits) {
  auto pool = make_pool();
  auto [a, b] = connected_pair();
  ASSERT_TRUE(a.valid() && b.valid());
  std::atomic<int> fired{0};
  auto watch = pool->watch(a.get(), [&] { fired.fetch_add(1); });
  ASSERT_TRUE(watch.ok());
  ASSERT_EQ(::write(b.get(), "x", 1), 1);  // never read: level-triggered, it would fire on
  EXPECT_TRUE(eventually([&] { return fired.load() == 1; }, 10s));
  for (int i = 0; i < 20; ++i) drain(*pool);
  EXPECT_EQ(fired.load(), 1);
  (*watch)->arm();
  EXPECT_TRUE(eventually([&] { return fired.load() == 2; }, 10s));
  watch->reset();  // no callback after the watch is gone
  ASSERT_EQ(::write(b.get(), "y", 1), 1);
  for (int i = 0; i < 20; ++i) drain(*pool);
  EXPECT_EQ(fired.load(), 2);
}

TEST(IoPool, AWatchSeesThePeerClose) {
  auto pool = make_pool();
  auto [a, b] = connected_pair();
  ASSERT_TRUE(a.valid() && b.valid());
  std::atomic<bool> fired{false};
  auto watch = pool->watch(a.get(), [&] { fired.store(true); });
  ASSERT_TRUE(watch.ok());
  b.reset();
  EXPECT_TRUE(eventually([&] { return fired.load(); }, 10s));
}

TEST(IoPool, ABlockedCallbackHoldsUpNothingAndItsExtraWorkerEndsWhenIdle) {
  // Declared before the pool, which ends (joining its workers) first.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> blocked{false};
  std::atomic<int> ran{0};
  auto pool = make_pool(100ms);
  EXPECT_EQ(pool->threads(), 1);
  pool->post([&] {
    blocked.store(true);
    released.wait();
  });
  ASSERT_TRUE(eventually([&] { return blocked.load(); }, 10s));
  for (int i = 0; i < 10; ++i) pool->post([&] { ran.fetch_add(1); });
  EXPECT_TRUE(eventually([&] { return ran.load() == 10; }, 10s)) << ran.load();
  EXPECT_GE(pool->threads(), 2);
  release.set_value();
  EXPECT_TRUE(eventually([&] { return pool->threads() == 1; }, 10s)) << pool->threads();
  pool->post([&] { ran.fetch_add(1); });  // the worker kept still serves
  EXPECT_TRUE(eventually([&] { return ran.load() == 11; }, 10s));
}

TEST(IoPool, ManyBlockedCallbacksGetAWorkerEach) {
  constexpr int kBlocked = 16;
  // Declared before the pool, which ends (joining its workers) first.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> waiting{0};
  auto pool = make_pool();
  for (int i = 0; i < kBlocked; ++i) {
    pool->post([&] {
      waiting.fetch_add(1);
      released.wait();
    });
  }
  EXPECT_TRUE(eventually([&] { return waiting.load() == kBlocked; }, 10s)) << waiting.load();
  EXPECT_GE(pool->threads(), kBlocked + 1);  // and one still waiting for events
  release.set_value();
}

TEST(IoPool, TheTimerRunsWhenAskedAndEarlierWhenWoken) {
  auto pool = make_pool();
  std::atomic<int> ticks{0};
  const auto far = IoPool::Clock::now() + 1h;
  pool->set_timer([&] {
    ticks.fetch_add(1);
    return far;  // the next tick is an hour away unless woken
  });
  pool->wake_timer_by(IoPool::Clock::now() + 1ms);
  EXPECT_TRUE(eventually([&] { return ticks.load() == 1; }, 10s));
  pool->wake_timer_by(far + 1h);  // later than asked: no effect
  for (int i = 0; i < 20; ++i) drain(*pool);
  EXPECT_EQ(ticks.load(), 1);
  pool->wake_timer_by(IoPool::Clock::now());
  EXPECT_TRUE(eventually([&] { return ticks.load() == 2; }, 10s));
}

TEST(IoPool, ACallbackMayDestroyThePool) {
  auto pool = make_pool();
  std::promise<void> gone;
  IoPool* raw = pool.get();
  raw->post([&pool, &gone] {
    pool.reset();
    gone.set_value();
  });
  EXPECT_EQ(gone.get_future().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(pool, nullptr);
}

TEST(IoPool, RefusesAKeepOutOfRangeNamingIt) {
  IoPool::Options o;
  o.keep = 0;
  auto pool = IoPool::create(o);
  ASSERT_FALSE(pool.ok());
  EXPECT_NE(pool.status().message().find("keep (0)"), std::string::npos)
      << pool.status().to_string();
}

}  // namespace
}  // namespace kvferry
