// Floods against the notification listener, from raw sockets on loopback: a stream of
// connect-hello-close cycles leaves no inbox entry and no memory behind; one sender
// pushing real notifications as fast as it can is held to its share of the inbox while
// another sender's notification gets in at once; and 500 open connections cost no thread.
// Every notification that arrives is checked byte for byte. Each test prints what it
// measured ("[ figures ]").
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/notify_receiver.h"
#include "hostile_clients.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "notification_raw_client.h"
#include "test_support.h"

namespace kvferry::testing {
namespace {

using namespace std::chrono_literals;
using detail::NotificationReceiver;
using detail::NotifyFrame;

Endpoint notify_endpoint_of(TransferEngine& engine) {
  const Endpoint handshake = must(parse_endpoint(engine.endpoint()));
  SegmentDescriptor d =
      must(parse_segment_descriptor(must(fetch_descriptor(handshake, Clock::now() + 5s))));
  return must(parse_endpoint(d.notify_endpoint));
}

// `bytes` random bytes from `seed`, led by the seed itself (so a notification says which
// one it is).
std::string numbered_text(size_t bytes, uint64_t seed) {
  std::string text(bytes, '\0');
  std::mt19937_64 rng(seed);
  for (char& c : text) c = static_cast<char>(rng());
  std::memcpy(text.data(), &seed, sizeof(seed));
  return text;
}

uint64_t number_of(const std::string& text) {
  uint64_t seed = 0;
  if (text.size() >= sizeof(seed)) std::memcpy(&seed, text.data(), sizeof(seed));
  return seed;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

TEST(NotificationListenerFlood, ConnectHelloCloseFloodLeavesNoEntryAndMemoryFlat) {
  NotificationReceiver::Options options;
  options.listen = Endpoint{"127.0.0.1", 0};
  options.incarnation = 1;
  // Every attacker comes from 127.0.0.1: what is measured here is what a cycle leaves
  // behind, not the per-source limit.
  options.limits.max_connections_per_source = 0;
  auto receiver = must(NotificationReceiver::start(options));
  const Endpoint endpoint = receiver->endpoint();
  constexpr int kAttackers = 4;
  constexpr int kCycles = 100'000;
  constexpr uint64_t kRssSlackBytes = uint64_t{50} << 20;
  const uint64_t rss_before = resident_bytes();
  // A connect that fails never reached the listener: at this rate the client side runs short
  // of loopback ports (each closed cycle leaves one in TIME_WAIT, which the kernel lends to a
  // new connect only a second later). Such a connect is tried again until a port is free,
  // for at most kConnectPatience; a cycle the listener accepted and did not welcome is a
  // failure. Reasons are kept and printed, so that a failure says which it was.
  constexpr auto kConnectPatience = 10s;
  std::atomic<int> next{0};
  std::atomic<int> welcomed{0};
  std::atomic<int> connect_retries{0};
  std::mutex reasons_mu;
  std::map<std::string, int> reasons;
  auto note = [&](const Status& s) {
    std::lock_guard lock(reasons_mu);
    ++reasons[s.to_string()];
  };
  const auto start = Clock::now();
  std::vector<std::thread> attackers;
  for (int t = 0; t < kAttackers; ++t) {
    attackers.emplace_back([&] {
      for (int i = next.fetch_add(1); i < kCycles; i = next.fetch_add(1)) {
        Result<RawNotifyClient> c = RawNotifyClient::connect(endpoint);
        const auto give_up = Clock::now() + kConnectPatience;
        while (!c.ok() && Clock::now() < give_up) {
          note(c.status());
          ++connect_retries;
          std::this_thread::sleep_for(1ms);  // the port state changes with time, not with tries
          c = RawNotifyClient::connect(endpoint);
        }
        if (!c.ok()) {
          note(c.status());
          continue;
        }
        // A name and incarnation of its own each time, as a forger would.
        if (Status opened = c->open(notify_hello(fmt::format("forged-{}", i), i)); opened.ok()) {
          ++welcomed;
        } else {
          note(opened);
        }
      }  // closed without a goodbye
    });
  }
  for (std::thread& t : attackers) t.join();
  const auto elapsed = Clock::now() - start;
  std::string why;
  for (const auto& [reason, count] : reasons) why += fmt::format("\n  {} x {}", count, reason);
  EXPECT_EQ(welcomed.load(), kCycles) << "failed cycles and connects, by reason:" << why;
  ASSERT_TRUE(wait_for_state([&] { return receiver->stats().connections == 0; }, 30s));
  const uint64_t rss_after = resident_bytes();
  const NotificationReceiver::Stats s = receiver->stats();
  EXPECT_EQ(s.welcomed, static_cast<uint64_t>(kCycles));
  EXPECT_TRUE(receiver->drain(SIZE_MAX).empty());
  EXPECT_EQ(s.inbox_entries, 0u);
  EXPECT_EQ(s.inbox_bytes, 0u);
  EXPECT_EQ(s.buffered_bytes, 0u);
  EXPECT_LT(rss_after, rss_before + kRssSlackBytes);
  EXPECT_LT(elapsed, 60s);
  std::printf(
      "[ figures ] %d connect/hello/close cycles in %.1f s (%.0f cycles/s, %d threads); "
      "RSS %.1f MB before, %.1f MB after; %d connects tried again\n",
      kCycles, seconds(elapsed), kCycles / seconds(elapsed), kAttackers, rss_before / 1048576.0,
      rss_after / 1048576.0, connect_retries.load());
}

// One flooding connection of the flooder: sends 4 KiB notifications, numbered
// (connection << 32 | sequence), as fast as the socket takes them until told to stop, then
// says goodbye; reads the acks on a thread of its own.
class FloodConnection {
 public:
  static constexpr size_t kBytes = kDefaultMaxNotificationBytes;

  FloodConnection(const Endpoint& to, uint64_t index) : index_(index) {
    client_.emplace(must(RawNotifyClient::connect(to)));
    EXPECT_TRUE(client_->open(notify_hello("flooder", 7)).ok());
    sender_ = std::thread([this] { send_until_stopped(); });
    reader_ = std::thread([this] { read_acks(); });
  }
  // Ends both threads, also where the test failed before the flood drained.
  ~FloodConnection() {
    abandoning_.store(true);
    stop();
    sender_.join();
    reader_.join();
  }

  void stop() { stopping_.store(true); }
  bool finished() const { return finished_.load(); }
  uint64_t sent() const { return sent_.load(); }
  uint64_t acked() const { return acked_.load(); }
  bool acks_in_order() const { return acks_in_order_.load(); }
  static uint64_t number(uint64_t index, uint64_t sequence) { return index << 32 | sequence; }

 private:
  // Sends `bytes` whole, waiting for room in slices; false when the connection failed or the
  // connection is being abandoned.
  bool send_whole(std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size() && !abandoning_.load()) {
      const ssize_t n = ::send(client_->fd(), bytes.data() + done, bytes.size() - done,
                               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        pollfd p{client_->fd(), POLLOUT, 0};
        ::poll(&p, 1, 50);
      } else {
        return false;
      }
    }
    return done == bytes.size();
  }

  void send_until_stopped() {
    for (uint64_t seq = 1; !stopping_.load(); ++seq) {
      const std::vector<std::byte> frame =
          make_frame(detail::kNotifyFormat, static_cast<uint16_t>(NotifyFrame::kNotify),
                     detail::encode_notify(seq, numbered_text(kBytes, number(index_, seq))));
      // The frame's first byte waits for room while not stopping; once it is out, the frame
      // is finished whatever happens.
      pollfd p{client_->fd(), POLLOUT, 0};
      while (!stopping_.load() && ::poll(&p, 1, 50) == 0) {
      }
      if (stopping_.load()) break;
      if (!send_whole(frame)) break;
      sent_.store(seq);
    }
    const std::vector<std::byte> bye =
        make_frame(detail::kNotifyFormat, static_cast<uint16_t>(NotifyFrame::kBye), {});
    send_whole(bye);
    finished_.store(true);
  }

  void read_acks() {
    const auto limit = Clock::now() + 120s;
    while (Clock::now() < limit && !abandoning_.load()) {
      Result<detail::NotifyMessage> m =
          detail::read_notify_frame(client_->fd(), 0, Clock::now() + 200ms);
      if (!m.ok()) {
        if (m.status().code() == StatusCode::kTimeout) continue;
        return;  // the listener closed after the goodbye
      }
      const Result<uint64_t> seq = detail::decode_sequence(m->payload);
      if (m->type != NotifyFrame::kAck || !seq.ok() || *seq != acked_.load() + 1) {
        acks_in_order_.store(false);
        return;
      }
      acked_.store(*seq);
    }
  }

  const uint64_t index_;
  std::optional<RawNotifyClient> client_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> abandoning_{false};
  std::atomic<bool> finished_{false};
  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> acked_{0};
  std::atomic<bool> acks_in_order_{true};
  std::thread sender_;
  std::thread reader_;
};

TEST(NotificationListenerFlood, OneSenderFloodStillLetsAnotherSendersNotificationThroughQuickly) {
  EngineOptions options;
  options.name = "flood-target";
  options.metrics = true;
  auto target = must(TransferEngine::create(options));
  auto legit = make_engine("legit");
  PeerHandle peer = must(legit->open_peer(target->endpoint()));
  const Endpoint notify = notify_endpoint_of(*target);
  auto held_back = [&](const char* reason) {
    return target->metrics().value("kvferry_engine_notifications_held_back_total",
                                   {{"reason", reason}});
  };
  // Two connections of one sender identity: its share is per sender, not per connection.
  constexpr uint64_t kConnections = 2;
  std::vector<std::unique_ptr<FloodConnection>> flood;
  for (uint64_t i = 0; i < kConnections; ++i) {
    flood.push_back(std::make_unique<FloodConnection>(notify, i));
  }
  // The flooder holds its share: its connections are no longer read.
  ASSERT_TRUE(wait_for_state([&] { return held_back("sender_share") >= 1; }, 30s));
  const std::string legit_bytes = numbered_text(FloodConnection::kBytes, 424242);
  const auto sent_at = Clock::now();
  Status s = legit->send_notification(peer, legit_bytes, 10s);
  const auto acked_at = Clock::now();
  ASSERT_TRUE(s.ok()) << s.to_string();
  // The owner drains: everything the flooder got in, and the legitimate one.
  std::vector<Notification> first;
  ASSERT_TRUE(wait_for_state([&] {
    for (Notification& n : target->get_notifications()) first.push_back(std::move(n));
    return !first.empty() && first.back().sender == "legit";
  })) << first.size()
      << " drained";
  const auto drained_at = Clock::now();
  EXPECT_EQ(first.back().bytes, legit_bytes);
  EXPECT_EQ(first.back().kind, Notification::Kind::kMessage);
  const size_t flooder_held = first.size() - 1;
  EXPECT_GT(flooder_held, 0u);
  EXPECT_LE(flooder_held * FloodConnection::kBytes, kDefaultMaxPendingNotificationBytes / 2)
      << "one sender held more than half the inbox";
  EXPECT_LT(acked_at - sent_at, 3s);
  EXPECT_LT(drained_at - sent_at, 3s);

  // The flood stops; every notification it sent arrives, in order per connection, each
  // acknowledged once it is in the inbox, none dropped.
  for (auto& f : flood) f->stop();
  std::vector<Notification> rest;
  auto all_in = [&] {
    uint64_t sent = 0;
    for (const auto& f : flood) {
      if (!f->finished()) return false;
      sent += f->sent();
    }
    return flooder_held + rest.size() == sent;
  };
  ASSERT_TRUE(wait_for_state(
      [&] {
        for (Notification& n : target->get_notifications()) rest.push_back(std::move(n));
        return all_in();
      },
      90s))
      << flooder_held + rest.size() << " flood notifications drained";
  std::vector<uint64_t> next(kConnections, 1);
  size_t verified = 0;
  for (const std::vector<Notification>* part : {&first, &rest}) {
    for (const Notification& n : *part) {
      if (n.sender == "legit") continue;
      ASSERT_EQ(n.sender, "flooder");
      ASSERT_EQ(n.kind, Notification::Kind::kMessage);
      const uint64_t number = number_of(n.bytes);
      const uint64_t index = number >> 32;
      ASSERT_LT(index, kConnections);
      ASSERT_EQ(number & 0xFFFFFFFF, next[index]) << "connection " << index << " out of order";
      ASSERT_EQ(n.bytes, numbered_text(FloodConnection::kBytes, number));
      ++next[index];
      ++verified;
    }
  }
  uint64_t total_sent = 0;
  for (uint64_t i = 0; i < kConnections; ++i) {
    total_sent += flood[i]->sent();
    EXPECT_TRUE(wait_for_state([&] { return flood[i]->acked() == flood[i]->sent(); }, 10s))
        << "connection " << i << ": " << flood[i]->acked() << " acked of " << flood[i]->sent();
    EXPECT_TRUE(flood[i]->acks_in_order());
  }
  EXPECT_EQ(verified, total_sent);
  EXPECT_EQ(target->metrics().value("kvferry_engine_notifications_dropped_total",
                                    {{"what", "unacknowledged"}}),
            0);
  flood.clear();
  std::printf(
      "[ figures ] one sender flooding 4 KiB notifications on %llu connections held "
      "%zu in the inbox (%.1f MiB) when another sender's notification was acknowledged "
      "%.1f ms after send_notification and drained after %.1f ms; %llu flood "
      "notifications delivered in all, held back %.0f times\n",
      static_cast<unsigned long long>(kConnections), flooder_held,
      flooder_held * FloodConnection::kBytes / 1048576.0, seconds(acked_at - sent_at) * 1e3,
      seconds(drained_at - sent_at) * 1e3, static_cast<unsigned long long>(total_sent),
      held_back("sender_share"));
}

TEST(NotificationListenerFlood, FiveHundredOpenConnectionsAddNoThread) {
  auto target = make_engine("crowd-target");
  const Endpoint notify = notify_endpoint_of(*target);
  constexpr int kConnections = 500;
  constexpr int kSources = 10;  // 50 each, under the 64 per source
  constexpr uint64_t kThreadSlack = 2;
  const uint64_t threads_before = thread_count();
  std::vector<RawNotifyClient> crowd;
  std::map<std::string, std::string> expected;
  for (int i = 0; i < kConnections; ++i) {
    Fd fd = connect_from(fmt::format("127.0.0.{}", 2 + i % kSources), notify);
    ASSERT_TRUE(fd.valid()) << "connection " << i;
    RawNotifyClient c(std::move(fd));
    const std::string name = fmt::format("crowd-{}", i);
    ASSERT_TRUE(c.open(notify_hello(name, i)).ok()) << name;
    expected[name] = numbered_text(256, 9000 + i);
    ASSERT_TRUE(c.notify(1, expected[name]).ok());
    ASSERT_EQ(must(c.ack()), 1u) << name;
    crowd.push_back(std::move(c));
  }
  const uint64_t threads_open = thread_count();
  EXPECT_LE(threads_open, threads_before + kThreadSlack);
  std::vector<Notification> got = target->get_notifications();
  ASSERT_EQ(got.size(), static_cast<size_t>(kConnections));
  for (const Notification& n : got) {
    ASSERT_TRUE(expected.contains(n.sender)) << n.sender;
    EXPECT_EQ(n.bytes, expected[n.sender]);
  }
  // They all go without a goodbye: each had delivered, so each is reported lost.
  crowd.clear();
  std::map<std::string, int> lost;
  ASSERT_TRUE(wait_for_state([&] {
    for (const Notification& n : target->get_notifications()) {
      if (n.kind == Notification::Kind::kSenderLost) ++lost[n.sender];
    }
    return lost.size() == static_cast<size_t>(kConnections);
  })) << lost.size()
      << " lost senders reported";
  for (const auto& [name, count] : lost) {
    EXPECT_TRUE(expected.contains(name)) << name;
    EXPECT_EQ(count, 1) << name;
  }
  EXPECT_LE(thread_count(), threads_before + kThreadSlack);
  std::printf("[ figures ] threads: %llu before, %llu with %d notification connections open\n",
              static_cast<unsigned long long>(threads_before),
              static_cast<unsigned long long>(threads_open), kConnections);
}

}  // namespace
}  // namespace kvferry::testing
