// PD session layer in one process: bootstrap server, prefill servers and decode clients with
// their own engines (shm between them), bytes verified on the decode side.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>

#include "core/named_thread.h"
#include "core/net.h"
#include "pd/bootstrap_json.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::pd {
namespace {

using testing::TpCase;
using namespace std::chrono_literals;
using testing::ModelShape;
using testing::TestRank;

class PdSessionTp : public ::testing::TestWithParam<TpCase> {};

// Every decode rank receives every page of a 3-chunk request (its head slice for MHA, a full
// copy for MLA) plus the aux row with the last chunk.
TEST_P(PdSessionTp, EveryDecodeRankVerifiesItsPages) {
  const TpCase c = GetParam();
  ModelShape m;
  m.mla = c.mla;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  std::vector<TestRank> prefill_ranks, decode_ranks;
  std::vector<std::unique_ptr<PrefillServer>> prefills;
  std::vector<std::unique_ptr<DecodeClient>> decodes;
  for (uint32_t r = 0; r < c.prefill_tp; ++r) {
    prefill_ranks.push_back(testing::make_rank("prefill", m, c.prefill_tp, r));
  }
  for (uint32_t r = 0; r < c.decode_tp; ++r) {
    decode_ranks.push_back(testing::make_rank("decode", m, c.decode_tp, r));
  }
  for (auto& r : prefill_ranks) prefills.push_back(testing::make_prefill(r, bootstrap->address()));
  for (auto& r : decode_ranks) decodes.push_back(testing::make_decode(r));

  const uint64_t room = 7, tokens = 10 * m.page_tokens - 1;  // last page partly filled
  const auto src_pages = testing::pages_from(3, 10);
  const auto dst_pages = testing::pages_from(20, 10, 1);
  std::vector<KvReceiver> receivers;
  for (size_t d = 0; d < decodes.size(); ++d) {
    receivers.push_back(testing::must(decodes[d]->create_receiver(bootstrap->address(), room)));
    ASSERT_TRUE(receivers.back().init(dst_pages, /*aux_row=*/2).ok());
  }
  std::vector<KvSender> senders;
  for (size_t p = 0; p < prefills.size(); ++p) {
    fill_request_pages(prefill_ranks[p].buffers.layout, src_pages, tokens, room,
                       prefill_ranks[p].heads);
    fill_rows(prefill_ranks[p].buffers.aux, 5, room);
    senders.push_back(testing::must(prefills[p]->create_sender(room)));
    ASSERT_EQ(senders.back().wait_at_least(RequestState::kWaitingForInput, 5s),
              RequestState::kWaitingForInput);
    std::span<const kv::PageIndex> all(src_pages);
    ASSERT_TRUE(senders.back().send(all.subspan(0, 4)).ok());
    ASSERT_TRUE(senders.back().send(all.subspan(4, 4)).ok());
    LastChunkExtras extras{5, kNoSlot};
    ASSERT_TRUE(senders.back().send(all.subspan(8), &extras).ok());
  }
  for (auto& s : senders)
    EXPECT_EQ(s.wait_final(5s), RequestState::kSuccess) << s.failure().to_string();
  for (size_t d = 0; d < receivers.size(); ++d) {
    ASSERT_EQ(receivers[d].wait_final(5s), RequestState::kSuccess)
        << receivers[d].failure().to_string();
    EXPECT_EQ(count_corrupt_pages(decode_ranks[d].buffers.layout, dst_pages, tokens, room,
                                  decode_ranks[d].heads),
              0u);
    EXPECT_EQ(count_corrupt_rows(decode_ranks[d].buffers.aux, 2, room), 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(TpPairs, PdSessionTp,
                         ::testing::Values(TpCase{false, 1, 1}, TpCase{false, 1, 2},
                                           TpCase{false, 2, 1}, TpCase{true, 1, 1},
                                           TpCase{true, 1, 2}, TpCase{true, 2, 1}));

TEST(PdSession, StateAndAuxArriveWithTheLastChunkOnly) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  const uint64_t room = 11, tokens = 8 * m.page_tokens;
  auto src = testing::pages_from(0, 8), dst = testing::pages_from(8, 8, 2);
  fill_request_pages(p.buffers.layout, src, tokens, room, p.heads);
  fill_rows(p.buffers.aux, 1, room);
  std::vector<kv::RowBuffer> p_state = {p.buffers.state[0].rows},
                             d_state = {d.buffers.state[0].rows};
  fill_rows(p_state, 3, room);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), room));
  ASSERT_TRUE(receiver.init(dst, 4, 6).ok());
  KvSender sender = testing::must(prefill->create_sender(room));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  std::span<const kv::PageIndex> all(src);
  ASSERT_TRUE(sender.send(all.subspan(0, 4)).ok());
  // Wait until the first chunk landed: the aux row and state slot must still be untouched.
  for (int i = 0; i < 200 && count_corrupt_pages(d.buffers.layout, std::span(dst).first(4),
                                                 4 * m.page_tokens, room, d.heads) != 0;
       ++i) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(count_corrupt_rows(d.buffers.aux, 4, room), 1u);
  EXPECT_EQ(count_corrupt_rows(d_state, 6, room), 1u);
  EXPECT_EQ(receiver.poll(), RequestState::kTransferring);
  LastChunkExtras extras{1, 3};
  ASSERT_TRUE(sender.send(all.subspan(4), &extras).ok());
  ASSERT_EQ(receiver.wait_final(5s), RequestState::kSuccess) << receiver.failure().to_string();
  EXPECT_EQ(count_corrupt_pages(d.buffers.layout, dst, tokens, room, d.heads), 0u);
  EXPECT_EQ(count_corrupt_rows(d.buffers.aux, 4, room), 0u);
  EXPECT_EQ(count_corrupt_rows(d_state, 6, room), 0u);
}

TEST(PdSession, SendRejectsBadChunksWithTypedErrors) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  KvSender early = testing::must(prefill->create_sender(1));
  auto pages = testing::pages_from(0, 4);
  EXPECT_EQ(early.send(pages).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(prefill->create_sender(1).status().code(), StatusCode::kAlreadyExists);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 1));
  ASSERT_TRUE(receiver.init(testing::pages_from(10, 3)).ok());
  ASSERT_EQ(early.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  Status too_many = early.send(pages);
  EXPECT_EQ(too_many.code(), StatusCode::kOutOfRange);
  EXPECT_NE(too_many.message().find("gave 3"), std::string::npos) << too_many.message();
  LastChunkExtras none;
  EXPECT_EQ(early.send(std::span(pages).first(2), &none).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(early.send(std::span(pages).first(3), &none).ok());
  EXPECT_EQ(receiver.wait_final(5s), RequestState::kSuccess);
  EXPECT_EQ(early.send(pages).code(), StatusCode::kFailedPrecondition);
}

TEST(PdSession, DecodeAbortIsAcknowledgedAndPrefillKeepsServing) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  KvReceiver aborted = testing::must(decode->create_receiver(bootstrap->address(), 1));
  ASSERT_TRUE(aborted.init(testing::pages_from(0, 8)).ok());
  KvSender sender = testing::must(prefill->create_sender(1));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  ASSERT_TRUE(sender.send(testing::pages_from(0, 4)).ok());
  aborted.abort("client went away");
  EXPECT_EQ(aborted.poll(), RequestState::kFailed);
  EXPECT_EQ(aborted.failure().code(), StatusCode::kCancelled);
  EXPECT_TRUE(aborted.wait_abort_acked(5s).ok());
  EXPECT_EQ(sender.wait_final(5s), RequestState::kFailed);
  EXPECT_EQ(sender.failure().code(), StatusCode::kCancelled);
  EXPECT_FALSE(sender.send(testing::pages_from(4, 4)).ok());

  KvReceiver next = testing::must(decode->create_receiver(bootstrap->address(), 2));
  ASSERT_TRUE(next.init(testing::pages_from(8, 2)).ok());
  KvSender s2 = testing::must(prefill->create_sender(2));
  ASSERT_EQ(s2.wait_at_least(RequestState::kWaitingForInput, 5s), RequestState::kWaitingForInput);
  LastChunkExtras none;
  ASSERT_TRUE(s2.send(testing::pages_from(0, 2), &none).ok());
  EXPECT_EQ(next.wait_final(5s), RequestState::kSuccess) << next.failure().to_string();
}

// Thread exhaustion (core/named_thread.h's seam stands in for the system refusing a thread):
// a prefill send whose worker thread cannot start, and a decode receiver whose connecting
// thread cannot start, fail their request with the reason on both sides; the process goes
// on, and the next request, once threads start, arrives intact.
TEST(PdSession, RequestsWhoseThreadsCannotStartFailWithTheReasonAndTheNextOneArrives) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  LastChunkExtras none;
  const uint64_t tokens = 4 * m.page_tokens;
  const auto src = testing::pages_from(0, 4), dst = testing::pages_from(8, 4);

  refuse_next_thread_starts(1, "kvf-pd-boot");
  KvReceiver unconnected = testing::must(decode->create_receiver(bootstrap->address(), 1));
  refuse_next_thread_starts(0);
  EXPECT_EQ(unconnected.wait_final(5s), RequestState::kFailed);
  EXPECT_TRUE(kvferry::testing::contains(unconnected.failure().message(),
                                         "cannot start thread kvf-pd-boot"))
      << unconnected.failure().to_string();

  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 2));
  ASSERT_TRUE(receiver.init(dst).ok());
  KvSender sender = testing::must(prefill->create_sender(2));
  ASSERT_EQ(sender.wait_at_least(RequestState::kWaitingForInput, 5s),
            RequestState::kWaitingForInput);
  refuse_next_thread_starts(1, "kvf-pd-s");
  Status sent = sender.send(src, &none);
  refuse_next_thread_starts(0);
  EXPECT_EQ(sent.code(), StatusCode::kInternal) << sent.to_string();
  EXPECT_TRUE(kvferry::testing::contains(sent.message(), "cannot start thread kvf-pd-s"))
      << sent.to_string();
  EXPECT_EQ(sender.wait_final(5s), RequestState::kFailed);
  EXPECT_EQ(receiver.wait_final(5s), RequestState::kFailed);
  EXPECT_TRUE(
      kvferry::testing::contains(receiver.failure().message(), "cannot start thread kvf-pd-s"))
      << receiver.failure().to_string();

  fill_request_pages(p.buffers.layout, src, tokens, 3, p.heads);
  KvReceiver next = testing::must(decode->create_receiver(bootstrap->address(), 3));
  ASSERT_TRUE(next.init(dst).ok());
  KvSender s3 = testing::must(prefill->create_sender(3));
  ASSERT_EQ(s3.wait_at_least(RequestState::kWaitingForInput, 5s), RequestState::kWaitingForInput);
  ASSERT_TRUE(s3.send(src, &none).ok());
  EXPECT_EQ(next.wait_final(5s), RequestState::kSuccess) << next.failure().to_string();
  EXPECT_EQ(s3.wait_final(5s), RequestState::kSuccess) << s3.failure().to_string();
  EXPECT_EQ(count_corrupt_pages(d.buffers.layout, dst, tokens, 3, d.heads), 0u);
}

TEST(PdSession, DeadPrefillFailsPendingRequestsWithinTwoHeartbeats) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  auto decode = testing::make_decode(d);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 3));
  ASSERT_TRUE(receiver.init(testing::pages_from(0, 4)).ok());
  ASSERT_EQ(receiver.wait_at_least(RequestState::kTransferring, 5s), RequestState::kTransferring);
  auto t0 = std::chrono::steady_clock::now();
  prefill.reset();
  EXPECT_EQ(receiver.wait_final(5s), RequestState::kFailed);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2 * testing::fast_timeouts().heartbeat_interval);
  EXPECT_EQ(receiver.failure().code(), StatusCode::kPeerDisconnected);
}

// What stands in for a prefill instance's bootstrap server once decode has connected
// through the real one: on the real one's address, it answers GET /health with `report` and
// counts the polls.
class HealthStandIn {
 public:
  HealthStandIn(const std::string& address, HealthReport report) {
    const Endpoint at = testing::must(parse_endpoint(address));
    server_.Get("/health", [this, report](const httplib::Request&, httplib::Response& res) {
      polls_.fetch_add(1);
      res.status = report.healthy ? 200 : 503;
      res.set_content(to_json(report).dump(), "application/json");
    });
    // The real server's connections linger on the port (TIME_WAIT; one it accepted as it
    // stopped, until its client closes it).
    server_.set_socket_options([](int fd) {
      const int yes = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
    for (int i = 0; i < 500 && !bound_; ++i) {
      bound_ = server_.bind_to_port(at.host, at.port);  // listening from here on
      if (!bound_) std::this_thread::sleep_for(10ms);
    }
    if (bound_) thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~HealthStandIn() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  bool bound() const { return bound_; }
  int polls() const { return polls_.load(); }

 private:
  httplib::Server server_;
  std::atomic<int> polls_{0};
  bool bound_ = false;
  std::thread thread_;
};

// One prefill instance (a bootstrap server, one prefill rank) and requests from the decode
// client `decode` to it: started until both sides wait for input, then sent and verified.
struct Instance {
  ModelShape m;
  std::unique_ptr<BootstrapServer> bootstrap = testing::must(BootstrapServer::start({}));
  TestRank rank;
  std::unique_ptr<PrefillServer> prefill;
  std::string address = bootstrap->address();

  explicit Instance(const std::string& name) : rank(testing::make_rank(name, m, 1, 0)) {
    prefill = testing::make_prefill(rank, address);
  }
  struct Request {
    uint64_t room = 0;
    KvReceiver receiver;
    KvSender sender;
  };
  Request start(DecodeClient& decode, uint64_t room) {
    Request r{room, testing::must(decode.create_receiver(address, room)), {}};
    EXPECT_TRUE(r.receiver.init(destination(room)).ok());
    r.sender = testing::must(prefill->create_sender(room));
    EXPECT_EQ(r.sender.wait_at_least(RequestState::kWaitingForInput, 5s),
              RequestState::kWaitingForInput);
    return r;
  }
  // Sends the request's pages and counts the corrupt ones that arrived in `decode_rank`.
  uint64_t finish(Request& r, const TestRank& decode_rank) {
    const std::vector<kv::PageIndex> src = testing::pages_from(0, 2);
    fill_request_pages(rank.buffers.layout, src, kTokens, r.room, rank.heads);
    LastChunkExtras none;
    EXPECT_TRUE(r.sender.send(src, &none).ok());
    EXPECT_EQ(r.receiver.wait_final(5s), RequestState::kSuccess)
        << r.receiver.failure().to_string();
    return count_corrupt_pages(decode_rank.buffers.layout, destination(r.room), kTokens, r.room,
                               decode_rank.heads);
  }
  static std::vector<kv::PageIndex> destination(uint64_t room) {
    return testing::pages_from(static_cast<kv::PageIndex>(room * 2), 2);
  }
  const uint64_t kTokens = 2 * m.page_tokens;
};

double health_polls(const DecodeClient& decode, const char* result) {
  return decode.metrics().value("kvferry_pd_bootstrap_checks_total", {{"result", result}});
}

// Decode asks a bootstrap server for /health only while a request of its instance is in
// flight: what the report can do is fail such requests, and polling every instance it ever
// reached would cost each bootstrap server a request per decode rank of the whole cluster
// every heartbeat (docs/SCALING.md). Two instances both reached; only the one with a request
// in flight is polled, the other from its first request on, and every page arrives.
TEST(PdSession, DecodePollsTheHealthOfAnInstanceOnlyWhileARequestOfItIsInFlight) {
  Instance a("prefill-a"), b("prefill-b");
  TestRank d = testing::make_rank("decode", a.m, 1, 0);
  auto decode = testing::make_decode(d, testing::fast_timeouts(), /*metrics=*/true);
  for (Instance* i : {&a, &b}) {
    Instance::Request first = i->start(*decode, i == &a ? 1 : 2);
    EXPECT_EQ(i->finish(first, d), 0u);
  }
  // a's bootstrap server is replaced by one that counts the polls.
  const HealthReport report = testing::must(BootstrapClient(a.address).health());
  a.bootstrap->stop();
  HealthStandIn stand_in(a.address, report);
  ASSERT_TRUE(stand_in.bound());

  Instance::Request on_b = b.start(*decode, 3);
  const double before = health_polls(*decode, "ok");
  for (int i = 0; i < 500 && health_polls(*decode, "ok") < before + 3; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(health_polls(*decode, "ok"), before + 3);  // b's, three heartbeats
  EXPECT_EQ(stand_in.polls(), 0);                      // a has nothing in flight

  Instance::Request on_a = a.start(*decode, 4);
  for (int i = 0; i < 500 && stand_in.polls() < 2; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_GE(stand_in.polls(), 2);
  EXPECT_EQ(a.finish(on_a, d), 0u);
  EXPECT_EQ(b.finish(on_b, d), 0u);
  EXPECT_EQ(health_polls(*decode, "failed"), 0);
}

// A bootstrap server that does not answer fails nothing (the requests go on over their
// control links), and is polled less and less often: each poll of a silent server can hold a
// bootstrap thread for its timeout, which new instances' connections would wait behind. While
// a healthy instance's server is polled nine times, a gone one is polled at most four.
TEST(PdSession, DecodePollsASilentBootstrapServerLessAndLessOftenAndFailsNothing) {
  Instance a("prefill-a"), b("prefill-b");
  TestRank d = testing::make_rank("decode", a.m, 1, 0);
  auto decode = testing::make_decode(d, testing::fast_timeouts(), /*metrics=*/true);
  Instance::Request on_a = a.start(*decode, 1);
  Instance::Request on_b = b.start(*decode, 2);
  a.bootstrap->stop();
  const double ok = health_polls(*decode, "ok"), missed = health_polls(*decode, "failed");
  for (int i = 0; i < 500 && health_polls(*decode, "ok") < ok + 9; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_GE(health_polls(*decode, "ok"), ok + 9);
  EXPECT_GE(health_polls(*decode, "failed"), missed + 1);
  EXPECT_LE(health_polls(*decode, "failed"), missed + 4);  // every heartbeat: 9
  EXPECT_EQ(a.finish(on_a, d), 0u);
  EXPECT_EQ(b.finish(on_b, d), 0u);
}

// A bootstrap server that reports a prefill rank restarted (another incarnation) or stale
// (it stopped heartbeating the server) fails the decode requests in flight on its instance,
// though their control links are still up, naming what the server reported.
TEST(PdSession, ARankTheBootstrapServerReportsRestartedOrStaleFailsTheRequestsInFlight) {
  struct Report {
    bool restarted;    // else stale
    const char* says;  // in the failure
  };
  for (const Report& reported :
       {Report{true, "restarted"}, Report{false, "stopped heartbeating the bootstrap server"}}) {
    SCOPED_TRACE(reported.says);
    Instance a("prefill");
    TestRank d = testing::make_rank("decode", a.m, 1, 0);
    auto decode = testing::make_decode(d);
    Instance::Request request = a.start(*decode, 1);
    HealthReport report = testing::must(BootstrapClient(a.address).health());
    ASSERT_EQ(report.ranks.size(), 1u);
    if (reported.restarted) {
      ++report.ranks[0].incarnation;
    } else {
      report.ranks[0].alive = false;
      report.healthy = false;
    }
    a.bootstrap->stop();
    HealthStandIn stand_in(a.address, report);
    ASSERT_TRUE(stand_in.bound());
    EXPECT_EQ(request.receiver.wait_final(5s), RequestState::kFailed);
    EXPECT_EQ(request.receiver.failure().code(), StatusCode::kPeerDisconnected);
    EXPECT_NE(request.receiver.failure().message().find(reported.says), std::string::npos)
        << request.receiver.failure().to_string();
    EXPECT_GE(stand_in.polls(), 1);
  }
}

// A prefill whose link is lost cannot acknowledge an abort, and its writes already on the
// way may still land (a hung or partitioned prefill resumes them): the pages of a request it
// was sending are not given back until its engine calls would have timed out.
TEST(PdSession, LostPrefillKeepsThePagesUntilItsWritesWouldHaveTimedOut) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank p = testing::make_rank("prefill", m, 1, 0), d = testing::make_rank("decode", m, 1, 0);
  auto prefill = testing::make_prefill(p, bootstrap->address());
  PdTimeouts timeouts = testing::fast_timeouts();
  timeouts.transfer_call_timeout = 500ms;
  auto decode = testing::make_decode(d, timeouts);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 5));
  ASSERT_TRUE(receiver.init(testing::pages_from(0, 4)).ok());
  ASSERT_EQ(receiver.wait_at_least(RequestState::kTransferring, 5s), RequestState::kTransferring);
  prefill.reset();
  ASSERT_EQ(receiver.wait_final(5s), RequestState::kFailed);
  EXPECT_EQ(receiver.failure().code(), StatusCode::kPeerDisconnected);
  EXPECT_EQ(receiver.wait_abort_acked(0ms).code(), StatusCode::kTimeout)
      << "pages given back while the lost prefill's writes may still land";
  EXPECT_TRUE(receiver.wait_abort_acked(5s).ok());
  // A request that never reached prefill is not held.
  KvReceiver unsent = testing::must(decode->create_receiver(bootstrap->address(), 6));
  EXPECT_EQ(unsent.wait_final(5s), RequestState::kFailed);
  EXPECT_TRUE(unsent.wait_abort_acked(0ms).ok());
}

// A request that times out while Bootstrapping keeps the code of the error that held it
// up, with the timeout in the message: whichever of the two deadlines (the receiver's, the
// connection attempt's) fires first, the caller learns WHY it timed out.
TEST(PdSession, UnreachableBootstrapFailsAsPeerUnreachableAfterTheTimeout) {
  ModelShape m;
  TestRank d = testing::make_rank("decode", m, 1, 0);
  PdTimeouts t = testing::fast_timeouts();
  t.bootstrap_timeout = 400ms;
  auto decode = testing::make_decode(d, t);
  const auto t0 = std::chrono::steady_clock::now();
  KvReceiver receiver = testing::must(decode->create_receiver("127.0.0.1:1", 4));
  ASSERT_EQ(receiver.wait_final(10s), RequestState::kFailed);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, t.bootstrap_timeout);
  const Status why = receiver.failure();
  EXPECT_EQ(why.code(), StatusCode::kPeerUnreachable) << why.to_string();
  EXPECT_TRUE(kvferry::testing::contains(why.message(), "after 400 ms")) << why.to_string();
  EXPECT_TRUE(kvferry::testing::contains(why.message(), "127.0.0.1:1")) << why.to_string();
}

TEST(PdSession, BootstrapWithoutRanksFailsAsFailedPreconditionAfterTheTimeout) {
  ModelShape m;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  TestRank d = testing::make_rank("decode", m, 1, 0);
  PdTimeouts t = testing::fast_timeouts();
  t.bootstrap_timeout = 400ms;
  auto decode = testing::make_decode(d, t);
  KvReceiver receiver = testing::must(decode->create_receiver(bootstrap->address(), 5));
  ASSERT_EQ(receiver.wait_final(10s), RequestState::kFailed);
  const Status why = receiver.failure();
  EXPECT_EQ(why.code(), StatusCode::kFailedPrecondition) << why.to_string();
  EXPECT_TRUE(kvferry::testing::contains(why.message(), "after 400 ms")) << why.to_string();
  EXPECT_TRUE(kvferry::testing::contains(why.message(), "no prefill rank registered"))
      << why.to_string();
}

}  // namespace
}  // namespace kvferry::pd
