// The route table (engine/route_choice.h) over the real transports, pinned row by row.
#include "engine/route_choice.h"

#include <gtest/gtest.h>

#include "core/thread_pool.h"
#include "test_support.h"
#include "transport/cma/cma_transport.h"
#include "transport/local/local_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#ifdef KVFERRY_WITH_CUDA
#include "transport/cuda_ipc/cuda_ipc_transport.h"
#include "unit/transport/fake_cuda_memory_api.h"
#endif

namespace kvferry::detail {
namespace {

using kvferry::testing::contains;

constexpr TransportSet kAll{TransportKind::kLocal, TransportKind::kShm, TransportKind::kTcp,
                            TransportKind::kCudaIpc, TransportKind::kCma};
constexpr RouteKey kHostToHost{MemoryKind::kHost, MemoryKind::kHost};
constexpr RouteKey kHostToShared{MemoryKind::kHost, MemoryKind::kSharedHost};
constexpr RouteKey kHostToDevice{MemoryKind::kHost, MemoryKind::kDevice};
constexpr RouteKey kDeviceToHost{MemoryKind::kDevice, MemoryKind::kHost};

SegmentDescriptor peer(TransportSet serves = kAll) {
  SegmentDescriptor d;
  d.endpoint = "127.0.0.1:9000";
  d.tcp_endpoint = "127.0.0.1:9001";
  d.host_id = "other-boot";
  d.pid = 4242;
  d.cma_socket = "kvferry-cma/4242/0000000000000001";
  d.transports = serves;
  return d;
}

// This engine's transports: the real ones of the build; cuda_ipc over a fake device that is
// usable or not, counting how often CUDA would have been initialised.
struct Engine {
  explicit Engine(bool device_usable = true, TransportSet serve = kAll,
                  bool tcp_stages_device = false) {
    TransportEnv env;
    env.listen_host = "127.0.0.1";
    env.workers = &pool;
    env.local_regions = [] { return std::make_shared<const RegionIndex>(); };
    auto add = [&](TransportKind kind, Result<std::unique_ptr<Transport>> t) {
      ASSERT_TRUE(t.ok()) << t.status().to_string();
      if (serve.contains(kind)) owned[static_cast<size_t>(kind)] = std::move(*t);
    };
    add(TransportKind::kLocal, make_local_transport(env));
    add(TransportKind::kShm, make_shm_transport(env));
    TransportEnv tcp_env = env;
    if (tcp_stages_device) {
      tcp_env.open_cuda_api = []() -> Result<std::shared_ptr<CudaMemoryApi>> {
        return std::shared_ptr<CudaMemoryApi>(std::make_shared<testing::FakeCudaMemoryApi>());
      };
    }
    add(TransportKind::kTcp, make_tcp_transport(tcp_env));
    add(TransportKind::kCma, make_cma_transport(env));
#ifdef KVFERRY_WITH_CUDA
    add(TransportKind::kCudaIpc,
        cuda_ipc::make_cuda_ipc_transport(
            [this, device_usable]() -> Result<std::unique_ptr<cuda_ipc::CudaIpcDevice>> {
              ++device_opens;
              if (!device_usable) return NotSupported("no CUDA device: no driver");
              return cuda_ipc::CudaIpcDevice::open(std::make_unique<testing::FakeCudaMemoryApi>());
            }));
#else
    (void)device_usable;
#endif
    for (size_t i = 0; i < owned.size(); ++i) served[i] = owned[i].get();
  }
  Route route(RouteKey key, const SegmentDescriptor& d, PeerPlace place,
              std::optional<TransportKind> forced = std::nullopt) const {
    RouteChoiceInput input;
    input.served = served;
    input.link_errors = link_errors;
    input.place = place;
    input.forced = forced;
    return choose_route(key, d, input);
  }

  ThreadPool pool{0};
  std::array<std::unique_ptr<Transport>, kAllTransportKinds.size()> owned;
  std::array<const Transport*, kAllTransportKinds.size()> served{};
  std::array<std::string, kAllTransportKinds.size()> link_errors;  // as connect() reported
  int device_opens = 0;
};

void expect_route(const Route& r, std::optional<TransportKind> expected, const char* reason = "") {
  if (expected) {
    ASSERT_TRUE(r.transport.has_value()) << r.reason;
    EXPECT_EQ(*r.transport, *expected) << r.reason;
  } else {
    EXPECT_FALSE(r.transport.has_value()) << transport_kind_name(*r.transport);
  }
  EXPECT_TRUE(contains(r.reason, reason)) << r.reason;
}

TEST(RouteChoice, SameHostHostMemoryGoesOverShmWhenShareableElseCma) {
  Engine e;
  SegmentDescriptor d = peer();
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost), TransportKind::kShm);
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost), TransportKind::kCma,
               "same host, both serve cma");
  EXPECT_EQ(e.device_opens, 0);  // host routes never initialise CUDA
}

TEST(RouteChoice, CmaRefusedByTheKernelFallsBackToTcpAndTheRouteSaysWhy) {
  Engine e;
  SegmentDescriptor d = peer();
  e.link_errors[static_cast<size_t>(TransportKind::kCma)] =
      "cma probe refused: the kernel refuses cross-memory attach to pid 4242 (EPERM)";
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost), TransportKind::kTcp,
               "same host, both serve tcp; passed over cma: cma probe refused: the kernel "
               "refuses cross-memory attach to pid 4242 (EPERM)");
  // Shareable memory is still shm's; nothing is passed over on its way.
  const Route shared = e.route(kHostToShared, d, PeerPlace::kSameHost);
  expect_route(shared, TransportKind::kShm);
  EXPECT_FALSE(contains(shared.reason, "passed over")) << shared.reason;
  d.tcp_endpoint.clear();
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost), std::nullopt,
               "shm: the peer's memory is not shareable (shm reaches only memory it allocated with "
               "allocate_shared); cma: cma probe refused: the kernel refuses cross-memory attach "
               "to pid 4242 (EPERM); tcp: the peer advertises no tcp endpoint");
}

TEST(RouteChoice, CmaCarriesHostMemoryOnOneHostOnly) {
  Engine e;
  SegmentDescriptor d = peer();
  // Another host (or pid namespace: the host id encodes it), the engine itself, device
  // memory, a peer without a pid: never cma.
  expect_route(e.route(kHostToHost, d, PeerPlace::kOtherHost, TransportKind::kCma), std::nullopt,
               "the peer is on another host or pid namespace (host id other-boot)");
  expect_route(e.route(kHostToHost, d, PeerPlace::kOtherHost), TransportKind::kTcp);
  expect_route(e.route(kHostToHost, d, PeerPlace::kSelf, TransportKind::kCma), std::nullopt,
               "it would reach this engine itself");
  expect_route(e.route(kHostToDevice, d, PeerPlace::kSameHost, TransportKind::kCma), std::nullopt,
               "cma copies host memory only");
  expect_route(e.route(kDeviceToHost, d, PeerPlace::kSameHost, TransportKind::kCma), std::nullopt,
               "cma copies host memory only");
  // Forced, it also carries shareable memory (it reaches any host memory).
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost, TransportKind::kCma),
               TransportKind::kCma, "forced");
  d.pid = 0;
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost), TransportKind::kTcp);
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost, TransportKind::kCma), std::nullopt,
               "the peer advertises no usable pid (0)");
  // A peer with no socket to prove who it is over: never cma (its pid would be taken on trust).
  d.pid = 4242;
  d.cma_socket.clear();
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost), TransportKind::kTcp);
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost, TransportKind::kCma), std::nullopt,
               "the peer serves no cma socket to prove who it is");
  // A peer that does not serve cma: tcp.
  const SegmentDescriptor old = peer(TransportSet{TransportKind::kShm, TransportKind::kTcp});
  expect_route(e.route(kHostToHost, old, PeerPlace::kSameHost), TransportKind::kTcp);
}

TEST(RouteChoice, AnotherHostIsReachedOverTcp) {
  Engine e;
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToShared, d, PeerPlace::kOtherHost), TransportKind::kTcp);
  expect_route(e.route(kHostToHost, d, PeerPlace::kOtherHost), TransportKind::kTcp);
  // Without a CUDA API to stage through, tcp carries no device memory.
  expect_route(e.route(kHostToDevice, d, PeerPlace::kOtherHost), std::nullopt,
               "tcp: this build has no CUDA: tcp cannot stage device memory");
}

TEST(RouteChoice, DeviceMemoryOnAnotherHostGoesOverTcpStagedThroughPinnedBuffers) {
  Engine e(true, kAll, /*tcp_stages_device=*/true);
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToDevice, d, PeerPlace::kOtherHost), TransportKind::kTcp);
  expect_route(e.route(kDeviceToHost, d, PeerPlace::kOtherHost), TransportKind::kTcp);
  expect_route(
      e.route(RouteKey{MemoryKind::kDevice, MemoryKind::kDevice}, d, PeerPlace::kOtherHost),
      TransportKind::kTcp);
}

TEST(RouteChoice, TheSelfPeerCopiesHostMemoryLocally) {
  Engine e;
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToHost, d, PeerPlace::kSelf), TransportKind::kLocal);
  expect_route(e.route(kHostToShared, d, PeerPlace::kSelf), TransportKind::kLocal);
}

TEST(RouteChoice, ForcedTransportIsTheOnlyCandidate) {
  Engine e;
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost, TransportKind::kTcp),
               TransportKind::kTcp, "forced");
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost, TransportKind::kShm), std::nullopt,
               "forced transport shm cannot carry host memory to the peer's host memory: the "
               "peer's memory is not shareable");
  expect_route(e.route(kHostToHost, d, PeerPlace::kOtherHost, TransportKind::kShm), std::nullopt,
               "the peer is on another host (host id other-boot)");
  expect_route(e.route(kHostToHost, d, PeerPlace::kSameHost, TransportKind::kRdma), std::nullopt,
               "this engine does not serve it");
}

TEST(RouteChoice, NothingReachesListsWhyForEachTransport) {
  Engine e(true, TransportSet{TransportKind::kShm, TransportKind::kCudaIpc});
  expect_route(e.route(kHostToShared, peer(), PeerPlace::kOtherHost), std::nullopt,
               "shm: the peer is on another host (host id other-boot); cma: this engine does not "
               "serve it; tcp: this engine does not serve it");
}

TEST(RouteChoice, APeerThatDoesNotServeATransportIsNotRoutedOverIt) {
  Engine e;
  const SegmentDescriptor d = peer(TransportSet{TransportKind::kLocal, TransportKind::kTcp});
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost), TransportKind::kTcp);
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost, TransportKind::kShm), std::nullopt,
               "the peer does not serve it");
}

#ifdef KVFERRY_WITH_CUDA
TEST(RouteChoice, DeviceMemoryOnOneHostGoesOverCudaIpc) {
  Engine e;
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToDevice, d, PeerPlace::kSameHost), TransportKind::kCudaIpc);
  expect_route(e.route(kDeviceToHost, d, PeerPlace::kSelf), TransportKind::kCudaIpc);
  expect_route(e.route({MemoryKind::kDevice, MemoryKind::kSharedHost}, d, PeerPlace::kSameHost),
               TransportKind::kCudaIpc);
  expect_route(e.route(kDeviceToHost, d, PeerPlace::kSameHost), std::nullopt,
               "cuda_ipc: the peer's host memory is not shareable");
  EXPECT_EQ(e.device_opens, 1);  // opened once, on the first device route
}

TEST(RouteChoice, NoUsableDeviceRefusesDeviceRoutesSayingWhy) {
  Engine e(false);
  const SegmentDescriptor d = peer();
  expect_route(e.route(kHostToDevice, d, PeerPlace::kSameHost), std::nullopt,
               "cuda_ipc: no CUDA device: no driver");
  expect_route(e.route(kHostToDevice, d, PeerPlace::kSameHost, TransportKind::kCudaIpc),
               std::nullopt, "no CUDA device: no driver");
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost), TransportKind::kShm);
  expect_route(e.route(kHostToDevice, d, PeerPlace::kOtherHost, TransportKind::kCudaIpc),
               std::nullopt, "the peer is on another host");
  EXPECT_EQ(e.device_opens, 1);
}

TEST(RouteChoice, APeerThatDoesNotServeCudaIpcGetsNoDeviceRoute) {
  Engine e;
  const SegmentDescriptor d =
      peer(TransportSet{TransportKind::kShm, TransportKind::kTcp, TransportKind::kLocal});
  expect_route(e.route(kHostToDevice, d, PeerPlace::kSameHost), std::nullopt,
               "cuda_ipc: the peer does not serve it");
  expect_route(e.route(kHostToShared, d, PeerPlace::kSameHost), TransportKind::kShm);
}
#endif

}  // namespace
}  // namespace kvferry::detail
