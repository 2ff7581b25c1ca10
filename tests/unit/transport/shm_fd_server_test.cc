// The shm fd server: a same-host peer gets an engine's memfd (SCM_RIGHTS) only when it may —
// with a secret, only by proving it — and an engine pair with one secret moves bytes over shm.
#include "transport/shm_fd_server.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <random>
#include <vector>

#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"
#include "transport/shm_mapping.h"

namespace kvferry {
namespace {

using testing::must;

constexpr auto kTimeout = std::chrono::seconds(5);

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// One shared allocation with random bytes, served by a ShmFdServer.
struct Served {
  explicit Served(std::optional<std::string> secret)
      : allocation(must(ShmAllocation::create("fd-server-test", 1 << 16))),
        bytes(random_bytes(allocation->bytes(), 7)) {
    std::memcpy(allocation->addr(), bytes.data(), bytes.size());
    server = must(ShmFdServer::start(
        0x1234,
        [this](uint64_t inode) {
          return inode == allocation->inode() ? Fd(::dup(allocation->fd())) : Fd();
        },
        std::move(secret), kTimeout));
  }
  // Maps what fetch_shm_fd returned and compares it with the allocation's bytes.
  bool maps_the_same_bytes(Fd fd) const {
    auto mapping =
        ShmMapping::open(std::move(fd), "test", allocation->bytes(), allocation->inode());
    return mapping.ok() && std::memcmp((*mapping)->base(), bytes.data(), bytes.size()) == 0;
  }
  std::unique_ptr<ShmAllocation> allocation;
  std::vector<std::byte> bytes;
  std::unique_ptr<ShmFdServer> server;
};

TEST(ShmFdServer, WithoutASecretTheSameUserGetsTheMemfd) {
  Served s(std::nullopt);
  auto fd =
      fetch_shm_fd(s.server->name(), s.allocation->inode(), std::nullopt, Clock::now() + kTimeout);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(s.maps_the_same_bytes(std::move(*fd)));
  auto unknown = fetch_shm_fd(s.server->name(), s.allocation->inode() + 1, std::nullopt,
                              Clock::now() + kTimeout);
  EXPECT_EQ(unknown.status().code(), StatusCode::kPeerDisconnected) << unknown.status().to_string();
}

TEST(ShmFdServer, WithASecretOnlyAProvenPeerGetsTheMemfd) {
  Served s(std::string("shm-secret"));
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("another-secret")}) {
    auto refused =
        fetch_shm_fd(s.server->name(), s.allocation->inode(), secret, Clock::now() + kTimeout);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated)
        << refused.status().to_string();
  }
  auto fd = fetch_shm_fd(s.server->name(), s.allocation->inode(), std::string("shm-secret"),
                         Clock::now() + kTimeout);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(s.maps_the_same_bytes(std::move(*fd)));
}

TEST(ShmFdServer, AnUnreachableSocketIsNotSupported) {
  auto fd = fetch_shm_fd("kvferry-shm/no-such-engine", 1, std::nullopt, Clock::now() + kTimeout);
  EXPECT_EQ(fd.status().code(), StatusCode::kNotSupported) << fd.status().to_string();
}

// Two engines with one secret: the descriptor carries no /proc path to use, the memfd comes
// over the socket, and a WRITE lands over shm, every byte checked.
TEST(ShmFdServer, EnginesWithTheSameSecretWriteOverShm) {
  auto target = testing::make_engine("target", 2, "engine-secret");
  auto initiator = testing::make_engine("initiator", 2, "engine-secret");
  SharedBuffer dst = must(target->allocate_shared(1 << 20));
  std::vector<std::byte> src = random_bytes(1 << 20, 11);
  ASSERT_TRUE(initiator->register_memory(src.data(), src.size()).ok());
  PeerHandle peer = must(initiator->open_peer(target->endpoint()));
  EXPECT_EQ(peer.transport(), TransportKind::kShm);
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                reinterpret_cast<uint64_t>(dst.addr), src.size()};
  ASSERT_TRUE(initiator->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_EQ(std::memcmp(dst.addr, src.data(), src.size()), 0);
  // Without the secret the descriptor, and so the memory, is out of reach.
  auto stranger = testing::make_engine("stranger");
  EXPECT_EQ(stranger->open_peer(target->endpoint()).status().code(), StatusCode::kUnauthenticated);
}

}  // namespace
}  // namespace kvferry
