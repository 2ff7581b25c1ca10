// The shm fd server: a same-host peer gets an engine's memfd (SCM_RIGHTS) only when it may —
// with a secret, only by proving it — and an engine pair with one secret moves bytes over shm.
#include "transport/shm_fd_server.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <thread>
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
  explicit Served(std::optional<std::string> secret,
                  std::chrono::milliseconds io_timeout = kTimeout)
      : allocation(must(ShmAllocation::create("fd-server-test", 1 << 16))),
        bytes(random_bytes(allocation->bytes(), 7)) {
    std::memcpy(allocation->addr(), bytes.data(), bytes.size());
    server = must(ShmFdServer::start(
        0x1234,
        [this](uint64_t inode) {
          return inode == allocation->inode() ? Fd(::dup(allocation->fd())) : Fd();
        },
        std::move(secret), io_timeout));
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

// A client connection to the abstract socket `name` that sends nothing.
Fd connect_idle(const std::string& name) {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) return Fd();
  return fd;
}

// True once the server closed `fd` (EOF after whatever it sent), waiting at most `wait`.
bool closed_by_server(int fd, std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) return false;
    std::byte sink[64];
    ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

// 100 idle clients: at most kMaxConnections are held (the rest closed at once), each only
// until its deadline; then the server serves a peer again.
TEST(ShmFdServer, AnIdleCrowdIsBoundedAndItsPlacesFreeUpAtTheDeadline) {
  Served s(std::nullopt, std::chrono::milliseconds(2000));
  std::vector<Fd> crowd;
  for (int i = 0; i < 100; ++i) {
    crowd.push_back(connect_idle(s.server->name()));
    ASSERT_TRUE(crowd.back().valid()) << "connection " << i;
  }
  // The connections over the limit are closed as the accept loop reaches them; counted until
  // they are, well before the 2 s deadline, when only they may be gone.
  const auto counted_by = Clock::now() + std::chrono::milliseconds(1500);
  size_t closed_at_once = 0;
  for (;;) {
    closed_at_once = 0;
    for (const Fd& fd : crowd) {
      if (closed_by_server(fd.get(), std::chrono::milliseconds(0))) ++closed_at_once;
    }
    if (closed_at_once >= 100u - 64u || Clock::now() > counted_by) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(closed_at_once, 100u - 64u);
  EXPECT_LT(closed_at_once, 100u);
  for (const Fd& fd : crowd) {
    EXPECT_TRUE(closed_by_server(fd.get(), std::chrono::milliseconds(6000)));
  }
  auto fd = fetch_shm_fd(s.server->name(), ::getpid(), s.allocation->inode(), std::nullopt,
                         Clock::now() + kTimeout);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(s.maps_the_same_bytes(std::move(*fd)));
}

TEST(ShmFdServer, WithoutASecretTheSameUserGetsTheMemfd) {
  Served s(std::nullopt);
  auto fd = fetch_shm_fd(s.server->name(), ::getpid(), s.allocation->inode(), std::nullopt,
                         Clock::now() + kTimeout);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(s.maps_the_same_bytes(std::move(*fd)));
  auto unknown = fetch_shm_fd(s.server->name(), ::getpid(), s.allocation->inode() + 1, std::nullopt,
                              Clock::now() + kTimeout);
  EXPECT_EQ(unknown.status().code(), StatusCode::kPeerDisconnected) << unknown.status().to_string();
}

TEST(ShmFdServer, WithASecretOnlyAProvenPeerGetsTheMemfd) {
  Served s(std::string("shm-secret"));
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("another-secret")}) {
    auto refused = fetch_shm_fd(s.server->name(), ::getpid(), s.allocation->inode(), secret,
                                Clock::now() + kTimeout);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated)
        << refused.status().to_string();
  }
  auto fd = fetch_shm_fd(s.server->name(), ::getpid(), s.allocation->inode(),
                         std::string("shm-secret"), Clock::now() + kTimeout);
  ASSERT_TRUE(fd.ok()) << fd.status().to_string();
  EXPECT_TRUE(s.maps_the_same_bytes(std::move(*fd)));
}

TEST(ShmFdServer, AnUnreachableSocketIsNotSupported) {
  auto fd = fetch_shm_fd("kvferry-shm/no-such-engine", ::getpid(), 1, std::nullopt,
                         Clock::now() + kTimeout);
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
