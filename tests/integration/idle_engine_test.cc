// An engine with nothing to do sleeps: none of its threads wakes on a timer while no request,
// connection or deadline is under way. A deployment holds many engines idle most of the time
// (a worker reached by hundreds of peers sees each of them rarely), and a loop that ticks every
// few milliseconds in each of them keeps every core of the host waking for nothing and delays
// the one engine that has work: with 256 idle `kvferry serve` children ticking 100 times a
// second each, a 64 KiB write to one of them took twice as long at p99.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/pattern.h"
#include "kvferry/transport_kind.h"
#include "test_support.h"

namespace kvferry {
namespace {

using namespace std::chrono_literals;
using testing::must;

// Times kvferry's threads of this process went to sleep and were woken (voluntary context
// switches), summed over every "kvf-" thread.
uint64_t kvf_thread_wakeups() {
  uint64_t total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.rfind("kvf-", 0) != 0) continue;
    std::ifstream status(task.path() / "status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) {
        total += std::stoull(line.substr(line.find(':') + 1));
      }
    }
  }
  return total;
}

TEST(IdleEngine, ItsThreadsSleepOnceTheWorkIsDoneUntilSomethingComes) {
  EngineOptions o;
  o.name = "idle-initiator";
  auto engine = must(TransferEngine::create(o));
  EngineOptions t = o;
  t.name = "idle-target";
  auto target = must(TransferEngine::create(t));
  std::vector<std::byte> src(1 << 20), dst(1 << 20);
  fill_pattern(src, 11);
  ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
  ASSERT_TRUE(target->register_memory(dst.data(), dst.size()).ok());
  // Every kind of connection an engine keeps open between requests: tcp lanes and the tcp
  // server's connection, the same-host route's, the notification channel.
  std::vector<PeerHandle> peers;
  for (TransportKind kind : {TransportKind::kTcp, TransportKind::kCma}) {
    PeerOptions po;
    po.transport = kind;
    peers.push_back(must(engine->open_peer(target->endpoint(), po)));
    std::fill(dst.begin(), dst.end(), std::byte{0});
    TransferOp op{OpKind::kWrite, testing::addr_of(src.data()), testing::addr_of(dst.data()),
                  src.size()};
    const std::string_view route = transport_kind_name(kind);
    ASSERT_TRUE(engine->transfer_sync(peers.back(), {&op, 1}).ok()) << route;
    EXPECT_EQ(dst, src) << route;
    ASSERT_TRUE(engine->send_notification(peers.back(), "hello").ok()) << route;
  }
  size_t notified = 0;
  ASSERT_TRUE(testing::eventually([&] {
    notified += target->get_notifications().size();
    return notified == peers.size();
  }));

  // What is under way winds down (a lane's reader and its tending end a while after the last
  // answer); then half a second passes with no thread of either engine woken. A loop ticking
  // every 20 ms would wake 25 times in it.
  uint64_t wakeups_in_window = 0;
  const bool quiet = testing::eventually(
      [&] {
        const uint64_t before = kvf_thread_wakeups();
        std::this_thread::sleep_for(500ms);
        wakeups_in_window = kvf_thread_wakeups() - before;
        return wakeups_in_window <= 1;
      },
      15s);
  EXPECT_TRUE(quiet) << wakeups_in_window << " wake-ups in the last half second";

  // Asleep is not deaf: each route still answers at once.
  for (PeerHandle& peer : peers) {
    std::fill(dst.begin(), dst.end(), std::byte{0});
    TransferOp op{OpKind::kWrite, testing::addr_of(src.data()), testing::addr_of(dst.data()),
                  src.size()};
    ASSERT_TRUE(engine->transfer_sync(peer, {&op, 1}).ok());
    EXPECT_EQ(dst, src);
  }
}

}  // namespace
}  // namespace kvferry
