#include "core/acceptor.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;

const Endpoint kAnyPort{"127.0.0.1", 0};

// Collects accepted connections.
struct Inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Fd> connections;

  void add(Fd fd) {
    std::lock_guard lock(mu);
    connections.push_back(std::move(fd));
    cv.notify_all();
  }
  bool wait_for(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, [&] { return connections.size() >= n; });
  }
};

Fd connect_to(const Acceptor& acceptor) {
  return testing::must(connect_tcp(acceptor.endpoint(), Clock::now() + 5s));
}

TEST(Acceptor, HandsEveryConnectionToTheCallback) {
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test")));
  EXPECT_NE(acceptor->endpoint().port, 0);
  Inbox inbox;
  ASSERT_TRUE(acceptor->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  Fd a = connect_to(*acceptor);
  Fd b = connect_to(*acceptor);
  ASSERT_TRUE(inbox.wait_for(2, 5s));
  EXPECT_TRUE(inbox.connections[0].valid());
  EXPECT_TRUE(inbox.connections[1].valid());
  EXPECT_EQ(acceptor->backoffs(), 0u);
}

// Small frames in a row (PD control replies, handshake answers) must not wait for the peer's
// delayed ACK: with Nagle on, 16 one-page PD requests in flight took 44 ms a wave, not 0.5.
TEST(Acceptor, HandsConnectionsWithNagleOff) {
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test")));
  Inbox inbox;
  ASSERT_TRUE(acceptor->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  Fd a = connect_to(*acceptor);
  ASSERT_TRUE(inbox.wait_for(1, 5s));
  int nodelay = 0;
  socklen_t len = sizeof(nodelay);
  ASSERT_EQ(::getsockopt(inbox.connections[0].get(), IPPROTO_TCP, TCP_NODELAY, &nodelay, &len), 0);
  EXPECT_NE(nodelay, 0);
}

TEST(Acceptor, StopEndsTheThreadPromptlyAndTheCallbackNeverRunsAfter) {
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test")));
  std::atomic<int> calls{0};
  ASSERT_TRUE(acceptor->start([&](Fd, ConnectionSlot) { calls.fetch_add(1); }).ok());
  const auto t0 = std::chrono::steady_clock::now();
  acceptor->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  Fd late = testing::must(connect_tcp(acceptor->endpoint(), Clock::now() + 5s));  // backlog
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(calls.load(), 0);
}

// A pending connection keeps the listener readable; with accept failing for lack of
// descriptors the thread must pause between attempts instead of spinning.
TEST(Acceptor, BacksOffWhileOutOfDescriptorsAndRecoversAfter) {
  std::atomic<int> attempts{0};
  std::atomic<bool> out_of_fds{true};
  Acceptor::Options options = Acceptor::Options::named("test");
  options.backoff = 20ms;
  options.accept_call = [&](int fd, int flags) {
    attempts.fetch_add(1);
    if (out_of_fds) {
      errno = EMFILE;
      return -1;
    }
    return ::accept4(fd, nullptr, nullptr, flags);
  };
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, options));
  Inbox inbox;
  ASSERT_TRUE(acceptor->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  Fd client = connect_to(*acceptor);
  std::this_thread::sleep_for(300ms);
  const int during = attempts.load();
  // 300 ms / 20 ms = 15 attempts when pausing; a spinning loop makes hundreds of thousands.
  EXPECT_GE(during, 2);
  EXPECT_LE(during, 30);
  EXPECT_GE(acceptor->backoffs(), 2u);
  {
    std::lock_guard lock(inbox.mu);
    EXPECT_TRUE(inbox.connections.empty());
  }

  out_of_fds = false;
  ASSERT_TRUE(inbox.wait_for(1, 5s));
  EXPECT_TRUE(inbox.connections[0].valid());
}

TEST(Acceptor, StopInterruptsABackOff) {
  Acceptor::Options options = Acceptor::Options::named("test");
  options.backoff = 10s;
  options.accept_call = [](int, int) {
    errno = ENFILE;
    return -1;
  };
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, options));
  ASSERT_TRUE(acceptor->start([](Fd, ConnectionSlot) {}).ok());
  Fd client = connect_to(*acceptor);
  while (acceptor->backoffs() == 0) std::this_thread::sleep_for(1ms);
  const auto t0 = std::chrono::steady_clock::now();
  acceptor->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
}

TEST(Acceptor, RetriesAtOnceWhenOnlyOneConnectionWasLost) {
  std::atomic<int> aborted{0};
  Acceptor::Options options = Acceptor::Options::named("test");
  options.backoff = 10s;  // a back-off would outlast the test
  options.accept_call = [&](int fd, int flags) {
    if (aborted.fetch_add(1) == 0) {
      errno = ECONNABORTED;  // the first peer reset before we took it
      return -1;
    }
    return ::accept4(fd, nullptr, nullptr, flags);
  };
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, options));
  Inbox inbox;
  ASSERT_TRUE(acceptor->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  Fd client = connect_to(*acceptor);
  ASSERT_TRUE(inbox.wait_for(1, 2s));
  EXPECT_EQ(acceptor->backoffs(), 0u);
}

TEST(Acceptor, ConnectionsOverTheLimitAreClosedUntilAPlaceIsFreed) {
  ListenerLimits limits;
  limits.max_connections = 2;
  auto acceptor =
      testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test", 0, limits)));
  std::mutex mu;
  std::vector<ConnectionSlot> slots;
  Inbox inbox;
  ASSERT_TRUE(acceptor
                  ->start([&](Fd fd, ConnectionSlot slot) {
                    {
                      std::lock_guard lock(mu);
                      slots.push_back(std::move(slot));
                    }
                    inbox.add(std::move(fd));
                  })
                  .ok());
  Fd a = connect_to(*acceptor);
  Fd b = connect_to(*acceptor);
  ASSERT_TRUE(inbox.wait_for(2, 5s));
  Fd over = connect_to(*acceptor);  // the listener's queue takes it; the acceptor closes it
  std::byte probe[1];
  EXPECT_EQ(recv_all(over.get(), probe, Clock::now() + 5s).code(), StatusCode::kPeerDisconnected);
  EXPECT_EQ(acceptor->refused(), 1u);
  EXPECT_EQ(acceptor->open_connections(), 2u);
  {
    std::lock_guard lock(mu);
    slots.pop_back();  // one connection is done with: its place is free
  }
  Fd next = connect_to(*acceptor);
  ASSERT_TRUE(inbox.wait_for(3, 5s));
  EXPECT_EQ(acceptor->open_connections(), 2u);
}

// A connection to the acceptor from `source` (a 127.0.0.N address, standing in for a host).
Fd connect_from(const std::string& source, const Acceptor& acceptor) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in local{};
  local.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &local.sin_addr);
  sockaddr_in remote{};
  remote.sin_family = AF_INET;
  remote.sin_port = htons(acceptor.endpoint().port);
  ::inet_pton(AF_INET, "127.0.0.1", &remote.sin_addr);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&remote), sizeof(remote)), 0);
  return fd;
}

// Whether the acceptor closed the connection (end of stream within a second).
bool closed_by_acceptor(const Fd& fd) {
  std::byte probe[1];
  return recv_all(fd.get(), probe, Clock::now() + 1s).code() == StatusCode::kPeerDisconnected;
}

// Whether the connection is still open (nothing to read, no end of stream).
bool still_open(const Fd& fd) {
  std::byte probe[1];
  return ::recv(fd.get(), probe, sizeof(probe), MSG_DONTWAIT) < 0 && errno == EAGAIN;
}

// An evicting acceptor whose connections (with their slots) are kept until the test ends.
struct EvictingListener {
  explicit EvictingListener(const ListenerLimits& limits) {
    Acceptor::Options options = Acceptor::Options::named("test", 0, limits);
    options.evict_idle = true;
    acceptor = testing::must(Acceptor::bind(kAnyPort, std::move(options)));
    EXPECT_TRUE(acceptor
                    ->start([this](Fd fd, ConnectionSlot slot) {
                      {
                        std::lock_guard lock(mu);
                        slots.push_back(std::move(slot));
                      }
                      inbox.add(std::move(fd));
                    })
                    .ok());
  }
  ~EvictingListener() { acceptor->stop(); }
  void mark_all_engaged() {
    std::lock_guard lock(mu);
    for (ConnectionSlot& slot : slots) EXPECT_TRUE(slot.mark_engaged());
  }

  std::unique_ptr<Acceptor> acceptor;
  std::mutex mu;
  std::vector<ConnectionSlot> slots;  // guarded by mu
  Inbox inbox;
};

TEST(EvictingAcceptor, AFullListenerClosesTheOldestIdleConnectionOfTheSourceHoldingMost) {
  ListenerLimits limits;
  limits.max_connections = 3;
  limits.max_connections_per_source = 0;
  EvictingListener listener(limits);
  Fd first = connect_from("127.0.0.2", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(1, 5s));
  Fd second = connect_from("127.0.0.2", *listener.acceptor);
  Fd other = connect_from("127.0.0.3", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(3, 5s));
  Fd newcomer = connect_from("127.0.0.4", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(4, 5s));
  EXPECT_TRUE(closed_by_acceptor(first));
  EXPECT_TRUE(still_open(second));
  EXPECT_TRUE(still_open(other));
  EXPECT_TRUE(still_open(newcomer));
  EXPECT_EQ(listener.acceptor->evicted(), 1u);
  EXPECT_EQ(listener.acceptor->refused(), 0u);
  EXPECT_EQ(listener.acceptor->open_connections(), 3u);
}

TEST(EvictingAcceptor, ASourceAtItsShareGivesWayToItselfNotToOthers) {
  ListenerLimits limits;
  limits.max_connections = 0;
  limits.max_connections_per_source = 2;
  EvictingListener listener(limits);
  Fd other = connect_from("127.0.0.3", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(1, 5s));
  Fd first = connect_from("127.0.0.2", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(2, 5s));
  Fd second = connect_from("127.0.0.2", *listener.acceptor);
  Fd third = connect_from("127.0.0.2", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(4, 5s));
  EXPECT_TRUE(closed_by_acceptor(first));
  EXPECT_TRUE(still_open(other));
  EXPECT_TRUE(still_open(second));
  EXPECT_TRUE(still_open(third));
  EXPECT_EQ(listener.acceptor->evicted(), 1u);
}

TEST(EvictingAcceptor, EngagedConnectionsAreNeverClosedToMakeRoom) {
  ListenerLimits limits;
  limits.max_connections = 2;
  EvictingListener listener(limits);
  Fd a = connect_from("127.0.0.2", *listener.acceptor);
  Fd b = connect_from("127.0.0.3", *listener.acceptor);
  ASSERT_TRUE(listener.inbox.wait_for(2, 5s));
  listener.mark_all_engaged();
  Fd over = connect_from("127.0.0.4", *listener.acceptor);
  EXPECT_TRUE(closed_by_acceptor(over));
  EXPECT_TRUE(still_open(a));
  EXPECT_TRUE(still_open(b));
  EXPECT_EQ(listener.acceptor->evicted(), 0u);
  EXPECT_EQ(listener.acceptor->refused(), 1u);
}

TEST(AcceptHub, EveryListenerOfTheProcessIsServedByOneThreadThatEndsWithTheLast) {
  constexpr size_t kListeners = 5;
  std::vector<std::unique_ptr<Acceptor>> acceptors;
  std::vector<std::unique_ptr<Inbox>> inboxes;
  for (size_t i = 0; i < kListeners; ++i) {
    acceptors.push_back(testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test"))));
    inboxes.push_back(std::make_unique<Inbox>());
    ASSERT_TRUE(
        acceptors.back()
            ->start([in = inboxes.back().get()](Fd fd, ConnectionSlot) { in->add(std::move(fd)); })
            .ok());
  }
  std::vector<Fd> clients;
  for (size_t i = 0; i < kListeners; ++i) {
    clients.push_back(connect_to(*acceptors[i]));
    clients.push_back(connect_to(*acceptors[i]));
  }
  for (size_t i = 0; i < kListeners; ++i) EXPECT_TRUE(inboxes[i]->wait_for(2, 5s)) << i;
  EXPECT_EQ(testing::threads_named("kvf-accept"), 1u);
  acceptors.clear();
  EXPECT_TRUE(testing::eventually([] { return testing::threads_named("kvf-accept") == 0; }, 10s));
}

// Resource exhaustion on one listener (a flood that used up its descriptors) pauses that one
// alone: another listener of the process accepts at once meanwhile.
TEST(AcceptHub, AListenerBackingOffHoldsUpNoOther) {
  Acceptor::Options starved = Acceptor::Options::named("starved");
  starved.backoff = 10s;
  starved.accept_call = [](int, int) {
    errno = EMFILE;
    return -1;
  };
  auto stuck = testing::must(Acceptor::bind(kAnyPort, starved));
  ASSERT_TRUE(stuck->start([](Fd, ConnectionSlot) {}).ok());
  Fd waiting = connect_to(*stuck);
  ASSERT_TRUE(testing::eventually([&] { return stuck->backoffs() != 0; }, 10s));
  auto healthy = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("healthy")));
  Inbox inbox;
  ASSERT_TRUE(healthy->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  std::vector<Fd> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(connect_to(*healthy));
  EXPECT_TRUE(inbox.wait_for(20, 5s));
  EXPECT_EQ(stuck->backoffs(), 1u);  // paused, not retried in a loop
}

// A flood of connections on one listener (a client that connects and leaves without end)
// keeps no other listener of the process waiting: each wake-up takes one burst of each ready
// listener in turn.
TEST(AcceptHub, AConnectionFloodOnOneListenerHoldsUpNoOther) {
  auto flooded = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("flooded")));
  std::atomic<uint64_t> flood_accepted{0};
  ASSERT_TRUE(flooded->start([&](Fd, ConnectionSlot) { flood_accepted.fetch_add(1); })
                  .ok());  // closed at once
  std::atomic<bool> flooding{true};
  std::atomic<bool> flood_over{false};  // the flood ended on its own (bound reached, or refused)
  std::thread flood([&] {
    for (int i = 0; i < 20'000 && flooding.load(); ++i) {
      Result<Fd> c = connect_tcp(flooded->endpoint(), Clock::now() + 5s);
      if (!c.ok()) break;
    }
    flood_over = true;
  });
  ASSERT_TRUE(testing::eventually([&] { return flood_accepted.load() >= 100; }, 10s));
  auto other = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("other")));
  Inbox inbox;
  ASSERT_TRUE(other->start([&](Fd fd, ConnectionSlot) { inbox.add(std::move(fd)); }).ok());
  std::vector<Fd> clients;
  for (int i = 0; i < 20; ++i) clients.push_back(connect_to(*other));
  const bool all_in = inbox.wait_for(20, 5s);
  const bool during_the_flood = !flood_over.load();
  flooding = false;
  flood.join();
  EXPECT_TRUE(all_in) << "accepted during the flood: " << inbox.connections.size();
  EXPECT_TRUE(during_the_flood);
}

// An owner may stop its listener from the callback (its last connection, say): the call
// returns, and nothing more is accepted, not even the rest of the burst under way (two
// connections are queued before the listener starts, so one wake-up finds both).
TEST(AcceptHub, StopFromTheCallbackReturnsAndEndsTheListener) {
  auto acceptor = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("test")));
  Fd first = connect_to(*acceptor);
  Fd second = connect_to(*acceptor);  // queued in the backlog, never accepted
  Inbox inbox;
  ASSERT_TRUE(acceptor
                  ->start([&](Fd fd, ConnectionSlot) {
                    acceptor->stop();
                    inbox.add(std::move(fd));
                  })
                  .ok());
  ASSERT_TRUE(inbox.wait_for(1, 5s));
  auto other = testing::must(Acceptor::bind(kAnyPort, Acceptor::Options::named("other")));
  Inbox other_inbox;
  ASSERT_TRUE(other->start([&](Fd fd, ConnectionSlot) { other_inbox.add(std::move(fd)); }).ok());
  Fd third = connect_to(*other);
  ASSERT_TRUE(other_inbox.wait_for(1, 5s));  // the thread went on serving others
  std::lock_guard lock(inbox.mu);
  EXPECT_EQ(inbox.connections.size(), 1u);
}

}  // namespace
}  // namespace kvferry
