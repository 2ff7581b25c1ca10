// The transport table (engine/transport_choice.h), pinned row by row.
#include <gtest/gtest.h>

#include "engine/transport_choice.h"
#include "test_support.h"

namespace kvferry::detail {
namespace {

using kvferry::testing::contains;

constexpr TransportSet kAll{TransportKind::kLocal, TransportKind::kShm, TransportKind::kTcp,
                            TransportKind::kCudaIpc};

SegmentDescriptor peer(bool device_memory, TransportSet serves = kAll) {
  SegmentDescriptor d;
  d.endpoint = "127.0.0.1:9000";
  d.tcp_endpoint = "127.0.0.1:9001";
  d.host_id = "other-boot";
  d.transports = serves;
  d.regions.push_back({0x1000, 64, {}, ShmBacking{3, 0, 4096, 77}, std::nullopt});
  if (device_memory) {
    d.regions.push_back(
        {0x9000, 64, {MemoryLocation::Kind::kCuda, 0}, std::nullopt, CudaIpcBacking{{}, 0, 64}});
  }
  return d;
}

struct Row {
  bool same_host;
  bool device_memory;
  bool device_usable;
  std::optional<TransportKind> forced;
  std::optional<TransportKind> expect;  // nullopt: NotSupported
  const char* reason;                   // in the error, when refused
};

TEST(TransportChoice, Table) {
  const Row rows[] = {
      {true, true, true, std::nullopt, TransportKind::kCudaIpc, ""},
      {true, false, true, std::nullopt, TransportKind::kShm, ""},
      {true, true, false, std::nullopt, TransportKind::kShm, ""},
      {false, true, true, std::nullopt, TransportKind::kTcp, ""},
      {false, false, true, std::nullopt, TransportKind::kTcp, ""},
      {true, false, true, TransportKind::kCudaIpc, TransportKind::kCudaIpc, ""},
      {true, true, true, TransportKind::kShm, TransportKind::kShm, ""},
      {true, true, true, TransportKind::kTcp, TransportKind::kTcp, ""},
      {false, true, true, TransportKind::kCudaIpc, std::nullopt, "the peer is on another host"},
      {true, true, false, TransportKind::kCudaIpc, std::nullopt, "no CUDA device: no driver"},
      {true, true, true, TransportKind::kRdma, std::nullopt, "this engine does not serve it"},
  };
  for (const Row& row : rows) {
    int asked = 0;
    TransportChoiceInput input;
    input.served = kAll;
    input.same_host = row.same_host;
    input.forced = row.forced;
    input.device_usable = [&] {
      ++asked;
      return row.device_usable ? Status::Ok() : NotSupported("no CUDA device: no driver");
    };
    SegmentDescriptor d = peer(row.device_memory);
    if (row.same_host) d.host_id = "this-boot";
    Result<TransportKind> chosen = choose_transport(d, input);
    std::string what = ::testing::PrintToString(row.same_host) + "/" +
                       ::testing::PrintToString(row.device_memory) + "/" +
                       ::testing::PrintToString(row.device_usable) + "/" +
                       (row.forced ? std::string(transport_kind_name(*row.forced)) : "auto");
    if (row.expect) {
      ASSERT_TRUE(chosen.ok()) << what << ": " << chosen.status().to_string();
      EXPECT_EQ(*chosen, *row.expect) << what;
    } else {
      ASSERT_FALSE(chosen.ok()) << what;
      EXPECT_EQ(chosen.status().code(), StatusCode::kNotSupported) << what;
      EXPECT_TRUE(contains(chosen.status().message(), row.reason))
          << what << ": " << chosen.status().message();
    }
    // CUDA is initialised only when cuda_ipc is in question.
    if (!row.device_memory && row.forced != TransportKind::kCudaIpc) {
      EXPECT_EQ(asked, 0) << what;
    }
    EXPECT_LE(asked, 1) << what;
  }
}

TEST(TransportChoice, ASameHostPeerWithPrivateHostMemoryGetsTcpUnlessTcpCannotReachIt) {
  TransportChoiceInput input;
  input.served = kAll;
  input.same_host = true;
  input.device_usable = [] { return Status::Ok(); };
  SegmentDescriptor d = peer(false);
  d.host_id = "this-boot";
  d.regions.push_back({0x5000, 64, {}, std::nullopt, std::nullopt});  // private
  EXPECT_EQ(*choose_transport(d, input), TransportKind::kTcp);
  d.tcp_endpoint.clear();
  EXPECT_EQ(*choose_transport(d, input), TransportKind::kShm);
}

TEST(TransportChoice, APeerThatDoesNotServeCudaIpcGetsShmEvenWithDeviceMemory) {
  TransportChoiceInput input;
  input.served = kAll;
  input.same_host = true;
  input.device_usable = [] { return Status::Ok(); };
  SegmentDescriptor d =
      peer(true, TransportSet{TransportKind::kShm, TransportKind::kTcp, TransportKind::kLocal});
  d.host_id = "this-boot";
  Result<TransportKind> chosen = choose_transport(d, input);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, TransportKind::kShm);
}

TEST(TransportChoice, NothingReachesListsWhyForEachTransport) {
  TransportChoiceInput input;
  input.served = TransportSet{TransportKind::kShm, TransportKind::kCudaIpc};
  input.device_usable = [] { return Status::Ok(); };
  Result<TransportKind> chosen = choose_transport(peer(true), input);
  ASSERT_FALSE(chosen.ok());
  EXPECT_TRUE(
      contains(chosen.status().message(),
               "cuda_ipc: the peer is on another host (host id other-boot); shm: the peer "
               "is on another host (host id other-boot); tcp: this engine does not serve it"))
      << chosen.status().message();
}

}  // namespace
}  // namespace kvferry::detail
