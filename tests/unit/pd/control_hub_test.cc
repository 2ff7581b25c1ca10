// ControlHub (pd/control_channel.h): one thread beats every control channel of an owner, and
// one pool reads them all. Each channel is one end of a socketpair; the other end is a raw
// peer that reads frames (or reads nothing, as a hung peer does) and writes them.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
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

TEST(ControlHub, OneThreadBeatsEveryChannelInSequenceAndNoneReadsOnAThreadOfItsOwn) {
  // A sanitizer's runtime starts a helper thread at the process's first thread: start one
  // first, so that it is not counted as the channels'.
  std::thread([] {}).join();
  ControlHub hub;
  std::vector<std::unique_ptr<Link>> links;
  for (int i = 0; i < 8; ++i) links.push_back(open_link());
  const ThreadCount before = threads_of_this_process("kvf-pd-beat");
  for (auto& link : links) link->channel->start(fast_beats(), hub);
  // The hub's beat thread and its reader pool's waiting worker (one more while a turn runs),
  // not a reader per channel (threads other tests left behind may end meanwhile, never start).
  EXPECT_LE(threads_of_this_process("").all, before.all + 3);
  // A new thread names itself once it runs.
  EXPECT_TRUE(kvferry::testing::eventually(
      [&] { return threads_of_this_process("kvf-pd-beat").named == before.named + 1; }, 10s));
  EXPECT_EQ(hub.size(), links.size());
  for (auto& link : links) {
    const auto deadline = Clock::now() + 10s;
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 0);
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 1);
    EXPECT_EQ(next_heartbeat(link->peer.get(), deadline), 2);
  }
  for (auto& link : links) link->channel->close();
}

// Frames that come a byte at a time, on many channels at once, are read over many turns of
// the shared pool: each channel's messages arrive whole, every one, in the order sent.
TEST(ControlHub, FramesInPiecesOnManyChannelsArriveWholeAndInOrder) {
  ControlHub hub;
  constexpr int kChannels = 16;
  constexpr uint64_t kMessages = 40;
  std::mutex mu;
  std::vector<std::vector<uint64_t>> seen(kChannels);
  std::vector<std::unique_ptr<Link>> links;
  for (int c = 0; c < kChannels; ++c) {
    std::array<int, 2> fds{};
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
    auto link = std::make_unique<Link>();
    link->peer = Fd(fds[1]);
    Link* raw = link.get();
    link->channel = ControlChannel::open(
        Fd(fds[0]), "peer",
        [&mu, &seen, c](ControlMessage&& m) {
          if (const auto* beat = std::get_if<Heartbeat>(&m); beat && beat->incarnation == 99) {
            std::lock_guard lock(mu);
            seen[c].push_back(beat->sequence);
          }
        },
        [raw](const Status& why) { raw->closed.set_value(why); });
    link->channel->start(fast_beats(), hub);
    links.push_back(std::move(link));
  }
  std::vector<std::vector<std::byte>> frames;
  for (uint64_t i = 0; i < kMessages; ++i)
    frames.push_back(encode_control_message(Heartbeat{i, 99}));
  // Byte by byte, the channels interleaved: a turn seldom finds a whole frame.
  for (const auto& frame : frames) {
    for (const std::byte& b : frame) {
      for (const auto& link : links) ASSERT_EQ(::send(link->peer.get(), &b, 1, MSG_NOSIGNAL), 1);
    }
  }
  ASSERT_TRUE(kvferry::testing::eventually(
      [&] {
        std::lock_guard lock(mu);
        return std::all_of(seen.begin(), seen.end(),
                           [](const auto& s) { return s.size() == kMessages; });
      },
      10s));
  for (int c = 0; c < kChannels; ++c) {
    for (uint64_t i = 0; i < kMessages; ++i) ASSERT_EQ(seen[c][i], i) << "channel " << c;
  }
  for (auto& link : links) link->channel->close();
}

// close() from the channel's own callback does not wait for itself; on_close runs once, and
// a close() from elsewhere afterwards returns at once.
TEST(ControlHub, ACallbackThatClosesItsChannelEndsItOnce) {
  ControlHub hub;
  std::array<int, 2> fds{};
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()), 0);
  Link link;
  link.peer = Fd(fds[1]);
  std::weak_ptr<ControlChannel> weak;
  link.channel = ControlChannel::open(
      Fd(fds[0]), "peer",
      [&weak](ControlMessage&&) {
        if (auto channel = weak.lock()) channel->close();
      },
      [&link](const Status& why) { link.closed.set_value(why); });  // a second call throws
  weak = link.channel;
  std::future<Status> closed = link.closed.get_future();
  link.channel->start(fast_beats(), hub);
  const std::vector<std::byte> frame = encode_control_message(Heartbeat{0, 99});
  ASSERT_EQ(::send(link.peer.get(), frame.data(), frame.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(frame.size()));
  ASSERT_EQ(closed.wait_for(10s), std::future_status::ready);
  const Status why = closed.get();
  EXPECT_EQ(why.code(), StatusCode::kCancelled) << why.to_string();
  link.channel->close();
  EXPECT_TRUE(link.channel->closed());
}

// A client that never reads: its channel's socket takes nothing more, and the wheel must not
// wait on it. The other channel keeps beating; the stuck one is skipped, not failed.
TEST(ControlHub, APeerThatReadsNothingHoldsUpNoOtherChannel) {
  ControlHub hub;
  auto stuck = open_link();
  auto healthy = open_link();
  // The stuck peer has read nothing, ever: its side of the stream is full before it starts.
  std::vector<std::byte> junk(64 << 10);
  for (size_t chunk : {junk.size(), size_t{1}}) {
    while (::send(stuck->channel_end.get(), junk.data(), chunk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
    }
  }
  stuck->channel->start(fast_beats(), hub);
  healthy->channel->start(fast_beats(), hub);
  // Twenty beats, 20 ms apart, in sequence: a wheel that waited on the stuck socket for a
  // send timeout at each of its beats would deliver a handful in the time allowed.
  const auto deadline = Clock::now() + 10s;
  for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(next_heartbeat(healthy->peer.get(), deadline), i);
  EXPECT_FALSE(stuck->channel->closed());  // skipped, not failed: its peer is not silent
  stuck->channel->close();
  healthy->channel->close();
}

TEST(ControlHub, ASilentPeerClosesItsChannelSayingSo) {
  ControlHub hub;
  auto link = open_link();
  std::future<Status> closed = link->closed.get_future();
  link->channel->start(fast_beats(100ms), hub);
  ASSERT_EQ(closed.wait_for(10s), std::future_status::ready);
  const Status why = closed.get();
  EXPECT_EQ(why.code(), StatusCode::kPeerDisconnected) << why.to_string();
  EXPECT_NE(why.message().find("silent for more than 100 ms"), std::string::npos)
      << why.to_string();
}

}  // namespace
}  // namespace kvferry::pd
