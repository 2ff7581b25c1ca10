// HeartbeatWheel (pd/control_channel.h): one thread beats every control channel of an owner.
// Each channel is one end of a socketpair; the other end is a raw peer that reads frames (or
// reads nothing, as a hung peer does).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "pd/control_channel.h"
#include "test_support.h"

namespace kvferry::pd {
namespace {

using namespace std::chrono_literals;

// Threads of this process, and those of them named `name`.
struct ThreadCount {
  size_t all = 0;
  size_t named = 0;
};
ThreadCount threads_of_this_process(const std::string& name) {
  ThreadCount n;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string thread_name;
    std::getline(comm, thread_name);
    ++n.all;
    n.named += thread_name == name;
  }
  return n;
}

ControlChannel::Heartbeats fast_beats(std::chrono::milliseconds silence = 60s) {
  ControlChannel::Heartbeats h;
  h.timeouts.heartbeat_interval = 20ms;
  h.timeouts.heartbeat_timeout = silence;
  h.incarnation = 7;
  return h;
}

// A channel on one end of a socketpair, the raw peer's descriptor on the other.
// `closed` is declared first so that it outlives the channel, whose reader sets it.
struct Link {
  std::promise<Status> closed;
  Fd peer;
  Fd channel_end;  // a duplicate of the channel's own descriptor
  std::shared_ptr<ControlChannel> channel;
};

std::unique_ptr<Link> open_link() {
  std::array<int, 2> fds{};
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
  auto link = std::make_unique<Link>();
  link->peer = Fd(fds[1]);
  link->channel_end = Fd(::dup(fds[0]));
  Link* raw = link.get();
  link->channel = ControlChannel::open(
      Fd(fds[0]), "peer", [](ControlMessage&&) {},
      [raw](const Status& why) { raw->closed.set_value(why); });
  return link;
}

// Reads whole frames from `fd` until one is a Heartbeat, within `deadline`; its sequence, or
// -1 on a timeout or a broken stream.
int64_t next_heartbeat(int fd, Clock::time_point deadline) {
  auto read_exactly = [&](std::byte* out, size_t n) {
    size_t got = 0;
    while (got < n) {
      pollfd p{fd, POLLIN, 0};
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
      const ssize_t r = ::recv(fd, out + got, n - got, 0);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  for (;;) {
    std::array<std::byte, kFrameHeaderBytes> header{};
    if (!read_exactly(header.data(), header.size())) return -1;
    Result<FrameHeader> h = decode_frame_header(header);
    if (!h.ok()) return -1;
    std::vector<std::byte> payload(h->payload_bytes);
    if (!read_exactly(payload.data(), payload.size())) return -1;
    Result<ControlMessage> m = decode_control_payload(h->type, payload);
    if (!m.ok()) return -1;
    if (const auto* beat = std::get_if<Heartbeat>(&*m)) {
      EXPECT_EQ(beat->incarnation, 7u);
      return static_cast<int64_t>(beat->sequence);
    }
  }
}

TEST(HeartbeatWheel, OneThreadBeatsEveryChannelInSequence) {
  // A sanitizer's runtime starts a helper thread at the process's first thread: start one
  // first, so that it is not counted as the channels'.
  std::thread([] {}).join();
  HeartbeatWheel wheel;
  std::vector<std::unique_ptr<Link>> links;
  for (int i = 0; i < 8; ++i) links.push_back(open_link());
  const ThreadCount before = threads_of_this_process("kvf-pd-beat");
  for (auto& link : links) link->channel->start(fast_beats(), wheel);
  // A reader per channel and one wheel thread for all, not a heartbeat thread per channel
  // (threads other tests left behind may end meanwhile, never start).
  EXPECT_LE(threads_of_this_process("").all, before.all + links.size() + 1);
  // A new thread names itself once it runs.
  EXPECT_TRUE(kvferry::testing::eventually(
      [&] { return threads_of_this_process("kvf-pd-beat").named == before.named + 1; }, 10s));
  EXPECT_EQ(wheel.size(), links.size());
  for (auto& link : links) {
    const auto deadline = Clock::now() + 10s;
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 0);
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 1);
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 2);
  }
  for (auto& link : links) link->channel->close();
}

// A client that never reads: its channel's socket takes nothing more, and the wheel must not
// wait on it. The other channel keeps beating; the stuck one is skipped, not failed.
TEST(HeartbeatWheel, APeerThatReadsNothingHoldsUpNoOtherChannel) {
  HeartbeatWheel wheel;
  auto stuck = open_link();
  auto healthy = open_link();
  // The stuck peer has read nothing, ever: its side of the stream is full before it starts.
  std::vector<std::byte> junk(64 << 10);
  for (size_t chunk : {junk.size(), size_t{1}}) {
    while (::send(stuck->channel_end.get(), junk.data(), chunk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
    }
  }
  stuck->channel->start(fast_beats(), wheel);
  healthy->channel->start(fast_beats(), wheel);
  // Twenty beats, 20 ms apart, in sequence: a wheel that waited on the stuck socket for a
  // send timeout at each of its beats would deliver a handful in the time allowed.
  const auto deadline = Clock::now() + 10s;
  for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(next_heartbeat(healthy->peer.get(), deadline), i);
  EXPECT_FALSE(stuck->channel->closed());  // skipped, not failed: its peer is not silent
  stuck->channel->close();
  healthy->channel->close();
}

TEST(HeartbeatWheel, ASilentPeerClosesItsChannelSayingSo) {
  HeartbeatWheel wheel;
  auto link = open_link();
  std::future<Status> closed = link->closed.get_future();
  link->channel->start(fast_beats(100ms), wheel);
  ASSERT_EQ(closed.wait_for(10s), std::future_status::ready);
  const Status why = closed.get();
  EXPECT_EQ(why.code(), StatusCode::kPeerDisconnected) << why.to_string();
  EXPECT_NE(why.message().find("silent for more than 100 ms"), std::string::npos)
      << why.to_string();
}

}  // namespace
}  // namespace kvferry::pd
