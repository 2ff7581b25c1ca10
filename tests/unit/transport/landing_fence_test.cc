// Landing windows and the wait for them, between threads of this process. No engine runs in
// these tests, so the windows counted are the tests' own.
#include "transport/landing_fence.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <thread>

namespace kvferry {
namespace {

constexpr auto kLimit = std::chrono::seconds(10);

// A wait for landings on a thread of its own: seen() is how many open windows it found; it
// goes on until they closed, and the destructor waits for it.
class Waiter {
 public:
  Waiter()
      : thread_([this] { wait_for_landings([this](size_t open) { found_.set_value(open); }); }) {}
  ~Waiter() { thread_.join(); }
  Waiter(const Waiter&) = delete;
  Waiter& operator=(const Waiter&) = delete;

  size_t seen() {
    std::future<size_t> f = found_.get_future();
    if (f.wait_for(kLimit) != std::future_status::ready) ADD_FAILURE() << "the wait never began";
    return f.get();
  }

 private:
  std::promise<size_t> found_;
  std::thread thread_;
};

TEST(LandingFence, AWaitBegunWhileAWindowIsOpenReturnsOnlyAfterItClosed) {
  std::promise<void> opened, release;
  std::atomic<bool> landed{false};
  std::thread receiver([&] {
    LandingWindow window;
    opened.set_value();
    release.get_future().wait();
    landed.store(true);  // the landing's last store, inside the window
  });
  opened.get_future().wait();
  std::promise<size_t> found;
  std::atomic<bool> returned{false};
  std::atomic<bool> landed_at_return{false};
  std::thread waiter([&] {
    wait_for_landings([&](size_t open) { found.set_value(open); });
    landed_at_return.store(landed.load());
    returned.store(true);
  });
  std::future<size_t> seen = found.get_future();
  ASSERT_EQ(seen.wait_for(kLimit), std::future_status::ready);
  EXPECT_EQ(seen.get(), 1u);
  // The receiver holds its window until released, so the waiter cannot have returned.
  EXPECT_FALSE(returned.load());
  release.set_value();
  waiter.join();
  receiver.join();
  EXPECT_TRUE(landed_at_return.load());
}

TEST(LandingFence, ClosedWindowsAreNotWaitedForAndANestedOneKeepsTheOuterOpen) {
  { EXPECT_EQ(Waiter().seen(), 0u); }
  std::optional<Waiter> while_nested, after_inner;  // outlive the windows they wait for
  {
    LandingWindow outer;
    {
      LandingWindow inner;
      while_nested.emplace();
      EXPECT_EQ(while_nested->seen(), 1u);
    }
    after_inner.emplace();
    EXPECT_EQ(after_inner->seen(), 1u);
  }
  while_nested.reset();  // both return now that the window closed
  after_inner.reset();
  { EXPECT_EQ(Waiter().seen(), 0u); }
  // A thread that opened and closed a window and ended leaves nothing behind.
  std::thread([] { LandingWindow w; }).join();
  { EXPECT_EQ(Waiter().seen(), 0u); }
}

TEST(LandingFence, AWaitInsideAWindowOfItsOwnThreadDoesNotWaitForItself) {
  LandingWindow window;
  std::optional<size_t> seen;
  wait_for_landings([&](size_t open) { seen = open; });
  EXPECT_EQ(seen, 0u);
}

}  // namespace
}  // namespace kvferry
