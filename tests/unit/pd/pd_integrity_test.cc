// Opt-in end-to-end integrity: prefill's page digests travel with Success, decode verifies
// the pages in place, and a byte flipped after it landed fails the request as DataCorrupted
// naming the page.
#include <gtest/gtest.h>

#include <atomic>

#include "pd/page_integrity.h"
#include "unit/pd/pd_fixture.h"

namespace kvferry::pd {
namespace {

using testing::TpCase;
using namespace std::chrono_literals;
using testing::ModelShape;
using testing::TestRank;

struct RequestSetup {
  bool mla = false;
  uint32_t prefill_tp = 1;
  uint32_t decode_tp = 1;
  bool prefill_integrity = true;
  bool decode_integrity = true;
  // Runs on decode rank 0 before it verifies a prefill rank's pages (given its buffers).
  std::function<void(const TestRank&, uint64_t room, uint32_t prefill_rank)> corrupt;
};

constexpr uint64_t kRoom = 11;

// Runs one 3-chunk request from every prefill rank to every decode rank; returns each decode
// rank's outcome and, on Success, checks every byte landed.
std::vector<Status> run_request(const RequestSetup& c) {
  ModelShape m;
  m.mla = c.mla;
  auto bootstrap = testing::must(BootstrapServer::start({}));
  std::vector<TestRank> prefill_ranks, decode_ranks;
  for (uint32_t r = 0; r < c.prefill_tp; ++r) {
    prefill_ranks.push_back(testing::make_rank("prefill", m, c.prefill_tp, r));
  }
  for (uint32_t r = 0; r < c.decode_tp; ++r) {
    decode_ranks.push_back(testing::make_rank("decode", m, c.decode_tp, r));
  }
  std::vector<std::unique_ptr<PrefillServer>> prefills;
  for (auto& r : prefill_ranks) {
    PrefillServerOptions o;
    o.engine = r.engine.get();
    o.buffers = r.buffers;
    o.tp = r.tp;
    o.bootstrap_address = bootstrap->address();
    o.timeouts = testing::fast_timeouts();
    o.integrity.enabled = c.prefill_integrity;
    prefills.push_back(testing::must(PrefillServer::create(std::move(o))));
  }
  std::vector<std::unique_ptr<DecodeClient>> decodes;
  for (size_t d = 0; d < decode_ranks.size(); ++d) {
    DecodeClientOptions o;
    o.engine = decode_ranks[d].engine.get();
    o.buffers = decode_ranks[d].buffers;
    o.tp = decode_ranks[d].tp;
    o.timeouts = testing::fast_timeouts();
    o.integrity.enabled = c.decode_integrity;
    if (d == 0 && c.corrupt) {
      const TestRank* rank = &decode_ranks[d];
      o.before_verify_for_test = [rank, f = c.corrupt](uint64_t room, uint32_t prefill_rank) {
        f(*rank, room, prefill_rank);
      };
    }
    decodes.push_back(testing::must(DecodeClient::create(std::move(o))));
  }
  const uint64_t tokens = 10 * m.page_tokens - 1;
  const auto src_pages = testing::pages_from(3, 10);
  const auto dst_pages = testing::pages_from(12, 10, 2);
  std::vector<KvReceiver> receivers;
  for (auto& decode : decodes) {
    receivers.push_back(testing::must(decode->create_receiver(bootstrap->address(), kRoom)));
    EXPECT_TRUE(receivers.back().init(dst_pages, /*aux_row=*/2).ok());
  }
  std::vector<KvSender> senders;
  for (size_t p = 0; p < prefills.size(); ++p) {
    fill_request_pages(prefill_ranks[p].buffers.layout, src_pages, tokens, kRoom,
                       prefill_ranks[p].heads);
    fill_rows(prefill_ranks[p].buffers.aux, 5, kRoom);
    senders.push_back(testing::must(prefills[p]->create_sender(kRoom)));
    EXPECT_EQ(senders.back().wait_at_least(RequestState::kWaitingForInput, 5s),
              RequestState::kWaitingForInput);
    std::span<const kv::PageIndex> all(src_pages);
    EXPECT_TRUE(senders.back().send(all.subspan(0, 4)).ok());
    EXPECT_TRUE(senders.back().send(all.subspan(4, 4)).ok());
    LastChunkExtras extras{5, kNoSlot};
    EXPECT_TRUE(senders.back().send(all.subspan(8), &extras).ok());
  }
  std::vector<Status> outcomes;
  for (size_t d = 0; d < receivers.size(); ++d) {
    const RequestState state = receivers[d].wait_final(5s);
    EXPECT_TRUE(is_final(state)) << "decode rank " << d << " still " << request_state_name(state);
    outcomes.push_back(receivers[d].failure());
    if (state == RequestState::kSuccess && !c.corrupt) {
      EXPECT_EQ(count_corrupt_pages(decode_ranks[d].buffers.layout, dst_pages, tokens, kRoom,
                                    decode_ranks[d].heads),
                0u);
    }
  }
  // Prefill's outcome is decided before decode verifies; let its reports finish before the
  // servers are torn down.
  for (auto& s : senders) EXPECT_TRUE(is_final(s.wait_final(5s)));
  return outcomes;
}

// The address of byte `offset` of page `page` of entry `entry` on a rank.
std::byte* page_byte(const TestRank& r, uint32_t entry, kv::PageIndex page, uint64_t offset) {
  const kv::KvEntry& e = r.buffers.layout.entries()[entry];
  return reinterpret_cast<std::byte*>(e.base + page * e.page_stride + offset);
}

class PdIntegrityTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(PdIntegrityTp, IntactPagesPassVerification) {
  const TpCase c = GetParam();
  for (const Status& s : run_request({c.mla, c.prefill_tp, c.decode_tp, true, true, {}})) {
    EXPECT_TRUE(s.ok()) << s.to_string();
  }
}

// The byte flipped is page 18 (the request's 4th page), layer entry 1, byte 0: token 0,
// head 0, which prefill rank 0 wrote under every TP pair here.
TEST_P(PdIntegrityTp, AByteFlippedAfterLandingFailsAsDataCorruptedNamingThePage) {
  const TpCase c = GetParam();
  std::atomic<int> flips{0};
  RequestSetup s{c.mla,
                 c.prefill_tp,
                 c.decode_tp,
                 true,
                 true,
                 [&](const TestRank& rank, uint64_t room, uint32_t prefill_rank) {
                   if (room != kRoom || prefill_rank != 0) return;
                   *page_byte(rank, 1, 18, 0) ^= std::byte{0x40};
                   ++flips;
                 }};
  std::vector<Status> outcomes = run_request(s);
  EXPECT_EQ(flips.load(), 1);
  ASSERT_FALSE(outcomes.empty());
  EXPECT_EQ(outcomes[0].code(), StatusCode::kDataCorrupted) << outcomes[0].to_string();
  EXPECT_NE(outcomes[0].message().find("page 18 "), std::string::npos) << outcomes[0].message();
  for (size_t d = 1; d < outcomes.size(); ++d) {
    EXPECT_TRUE(outcomes[d].ok()) << "decode rank " << d << ": " << outcomes[d].to_string();
  }
}

INSTANTIATE_TEST_SUITE_P(TpPairs, PdIntegrityTp,
                         ::testing::Values(TpCase{false, 1, 1}, TpCase{false, 1, 2},
                                           TpCase{false, 2, 1}, TpCase{true, 1, 1},
                                           TpCase{true, 2, 1}));

TEST(PdIntegrity, DecodeWithIntegrityRefusesSuccessWithoutDigests) {
  std::vector<Status> outcomes = run_request({false, 1, 1, false, true, {}});
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_EQ(outcomes[0].code(), StatusCode::kFailedPrecondition) << outcomes[0].to_string();
  EXPECT_NE(outcomes[0].message().find("without page digests"), std::string::npos);
}

TEST(PdIntegrity, DecodeWithoutIntegrityIgnoresDigests) {
  std::vector<Status> outcomes = run_request({false, 2, 1, true, false, {}});
  ASSERT_EQ(outcomes.size(), 1u);
  EXPECT_TRUE(outcomes[0].ok()) << outcomes[0].to_string();
}

TEST(PdIntegrity, DeviceMemoryIsNotSupportedNamingWhy) {
  ModelShape m;
  TestRank r = testing::make_rank("decode", m, 1, 0);
  DecodeClientOptions d;
  d.engine = r.engine.get();
  d.buffers = r.buffers;
  d.integrity = {true, MemoryLocation::Kind::kCuda};
  auto decode = DecodeClient::create(std::move(d));
  ASSERT_FALSE(decode.ok());
  EXPECT_EQ(decode.status().code(), StatusCode::kNotSupported);
  EXPECT_NE(decode.status().message().find("cannot read device memory"), std::string::npos);
  PrefillServerOptions p;
  p.engine = r.engine.get();
  p.buffers = r.buffers;
  p.integrity = {true, MemoryLocation::Kind::kCuda};
  auto prefill = PrefillServer::create(std::move(p));
  ASSERT_FALSE(prefill.ok());
  EXPECT_EQ(prefill.status().code(), StatusCode::kNotSupported);
}

TEST(PageIntegrityVerify, RefusesFootprintsOutsideTheLayoutAndPageListsThatDiffer) {
  ModelShape m;
  TestRank r = testing::make_rank("decode", m, 1, 0);
  const uint64_t item = r.buffers.layout.entries()[0].item_len;
  const std::vector<kv::PageIndex> pages{1, 2};
  auto code = [&](PageIntegrity integrity) {
    return detail::verify_pages(integrity, r.buffers.layout, pages, "test").code();
  };
  const auto entries = static_cast<uint32_t>(r.buffers.layout.entries().size());
  EXPECT_EQ(code({{{entries, 0, 8}}, {{1, 0}, {2, 0}}}), StatusCode::kProtocolError);
  EXPECT_EQ(code({{{0, item - 4, 8}}, {{1, 0}, {2, 0}}}), StatusCode::kProtocolError);
  EXPECT_EQ(code({{{0, 0, 8}}, {{1, 0}}}), StatusCode::kProtocolError);          // too few
  EXPECT_EQ(code({{{0, 0, 8}}, {{1, 0}, {3, 0}}}), StatusCode::kProtocolError);  // other page
  EXPECT_EQ(code({{{0, 0, 8}}, {{1, 0}, {2, 0}}}), StatusCode::kDataCorrupted);  // wrong digest
}

}  // namespace
}  // namespace kvferry::pd
