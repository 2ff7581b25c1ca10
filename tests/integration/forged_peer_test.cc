// Attack class: a forged segment descriptor (confused deputy). A process of another user
// (uid 65534, no kvferry, no secret) runs a fake handshake server whose descriptor names a
// third process — a root child holding pages shared with this test — or this engine's own
// pid, with addresses nobody registered. It even listens on abstract sockets named like an
// engine's cma and shm sockets. A root engine that opens it must refuse, over every route
// (auto, forced cma, forced shm), and no byte may reach the third process or the engine's
// own unregistered memory. The same forged descriptor put straight into etcd or Redis by a
// client with only store access fares no better, with a secret (unsigned record) or without
// (the cma identity check).
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdlib>
#include <optional>
#include <random>
#include <vector>

#include "core/byte_codec.h"
#include "core/frame_header.h"
#include "core/host_identity.h"
#include "core/net.h"
#include "core/pattern.h"
#include "metadata/handshake.h"
#include "metadata/metadata_store.h"
#include "metadata/segment_descriptor.h"
#include "transport/cma/cma_session.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::contains;
using testing::must;

constexpr uint64_t kPage = 4096;
constexpr size_t kPages = 2;  // one plain host region, one claiming to be shared memory

// Pages this test can see and another process owns: MAP_SHARED before fork.
struct SharedPages {
  SharedPages() {
    void* p = ::mmap(nullptr, kPages * kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    bytes = static_cast<std::byte*>(p);
    fill_pattern({bytes, kPages * kPage}, 0xC0FFEE);
  }
  ~SharedPages() { ::munmap(bytes, kPages * kPage); }
  bool untouched() const {
    std::vector<std::byte> expected(kPages * kPage);
    fill_pattern(expected, 0xC0FFEE);
    return std::equal(expected.begin(), expected.end(), bytes);
  }
  uint64_t addr(size_t page) const { return reinterpret_cast<uint64_t>(bytes) + page * kPage; }
  std::byte* bytes = nullptr;
};

// A root process that only holds its (shared) pages until it is killed.
struct Victim {
  Victim() {
    pid = ::fork();
    if (pid == 0) {
      for (;;) ::pause();
    }
  }
  ~Victim() {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  SharedPages pages;  // mapped before the fork above (members initialise first)
  pid_t pid = -1;
};

// The forged descriptor: a same-host engine that serves cma and shm, whose pid is `pid`,
// and whose two regions are the given pages (the second one claims an shm backing).
SegmentDescriptor forged_descriptor(const std::string& endpoint, int64_t pid, uint64_t page0,
                                    uint64_t page1, const std::string& sockets) {
  SegmentDescriptor d;
  d.name = "forged";
  d.endpoint = endpoint;
  d.incarnation = std::random_device{}() | 1;
  d.host_id = host_identity();
  d.pid = pid;
  d.transports.insert(TransportKind::kCma);
  d.transports.insert(TransportKind::kShm);
  d.cma_socket = "kvferry-cma/" + sockets;
  d.shm_socket = "kvferry-shm/" + sockets;
  d.version = 1;
  d.regions.push_back(RegionDescriptor{page0, kPage, {}, std::nullopt, std::nullopt, {}});
  ShmBacking shm;
  shm.fd = 3;
  shm.file_bytes = 2 * kPage;
  shm.inode = 12345;
  shm.guard_offset = kPage;
  shm.generation = 1;
  d.regions.push_back(RegionDescriptor{page1, kPage, {}, shm, std::nullopt, {}});
  return d;
}

std::vector<std::byte> cma_frame(CmaSessionFrame type, ByteWriter payload) {
  std::vector<std::byte> out(kFrameHeaderBytes + payload.size());
  encode_frame_header({kCmaSessionMagic, kCmaSessionVersion, static_cast<uint16_t>(type),
                       static_cast<uint32_t>(payload.size())},
                      std::span<std::byte, kFrameHeaderBytes>(out.data(), kFrameHeaderBytes));
  std::copy(payload.bytes().begin(), payload.bytes().end(), out.begin() + kFrameHeaderBytes);
  return out;
}

// The attacker: a child that becomes uid 65534 and answers every handshake on its listener
// with the descriptor, asking for no secret. On the abstract sockets the descriptor names it
// listens too, and on the cma one it speaks the session protocol, declaring the forged
// regions under the forged incarnation: only the kernel's word on who listens there (its
// own pid, not the one the descriptor names) can give it away. (The descriptor's own
// endpoint field is not the listener's: nothing checks it, and the attack does not need to.)
class FakeHandshakeServer {
 public:
  FakeHandshakeServer(const std::string& sockets, SegmentDescriptor descriptor)
      : listener_(must(listen_tcp(Endpoint{"127.0.0.1", 0}, &bound_))),
        descriptor_(std::move(descriptor)) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[0]);
      serve(fds[1], sockets);
    }
    ::close(fds[1]);
    ready_ = testing::read_lines(fds[0], 1, std::chrono::seconds(30))[0];
    ::close(fds[0]);
  }
  ~FakeHandshakeServer() {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
  const std::string& ready() const { return ready_; }
  std::string endpoint() const { return bound_.to_string(); }

 private:
  [[noreturn]] void serve(int report, const std::string& sockets) {
    if (!testing::drop_to_nobody()) {
      testing::write_line(report, "cannot drop privileges");
      ::_exit(1);
    }
    auto cma = listen_abstract("kvferry-cma/" + sockets, 16);
    auto shm = listen_abstract("kvferry-shm/" + sockets, 16);
    testing::write_line(report, cma.ok() && shm.ok() ? "ready" : "cannot listen");
    const std::string json = serialize_segment_descriptor(descriptor_);
    for (;;) {
      pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {cma->get(), POLLIN, 0}};
      if (::poll(fds, 2, -1) <= 0) continue;
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      std::byte header[kFrameHeaderBytes];
      if (fds[1].revents != 0) {
        Fd conn(::accept(cma->get(), nullptr, nullptr));
        if (!conn.valid()) continue;
        ByteWriter none;
        send_all(conn.get(), cma_frame(CmaSessionFrame::kChallenge, std::move(none)), deadline).ignore();
        if (!recv_all(conn.get(), header, deadline).ok()) continue;  // Open, empty
        ByteWriter declare;
        declare.put(uint8_t{0});
        declare.put(descriptor_.incarnation);
        declare.put(static_cast<uint32_t>(descriptor_.regions.size()));
        for (const RegionDescriptor& r : descriptor_.regions) {
          declare.put(r.addr);
          declare.put(r.length);
        }
        send_all(conn.get(), cma_frame(CmaSessionFrame::kDeclare, std::move(declare)), deadline).ignore();
        sessions_.push_back(std::move(conn));  // held open, as a real engine's would be
        continue;
      }
      Fd conn(::accept(listener_.get(), nullptr, nullptr));
      if (!conn.valid()) continue;
      if (!recv_all(conn.get(), header, deadline).ok()) continue;
      auto request = decode_handshake_header(header, 4096);
      if (!request.ok()) continue;
      std::vector<std::byte> payload(request->length);
      if (!recv_all(conn.get(), payload, deadline).ok()) continue;
      std::vector<std::byte> reply(kHandshakeHeaderBytes + json.size());
      encode_handshake_header({kHandshakeMagic, kHandshakeVersion, HandshakeFrame::kDescriptor,
                               static_cast<uint32_t>(json.size())},
                              reply.data());
      std::memcpy(reply.data() + kHandshakeHeaderBytes, json.data(), json.size());
      send_all(conn.get(), reply, deadline).ignore();
    }
  }

  Endpoint bound_;
  Fd listener_;
  SegmentDescriptor descriptor_;
  std::vector<Fd> sessions_;
  pid_t pid_ = -1;
  std::string ready_;
};

// Opens `name` with each route and, should an open ever succeed, writes and reads its two
// regions: the outcome that matters is that no byte moved.
void expect_every_route_refused(TransferEngine& engine, const std::string& name,
                                uint64_t page0, uint64_t page1, StatusCode expected) {
  std::vector<std::byte> src(kPage, std::byte{0x66});
  ASSERT_TRUE(engine.register_memory(src.data(), src.size()).ok());
  for (std::optional<TransportKind> route :
       {std::optional<TransportKind>(), std::optional<TransportKind>(TransportKind::kCma),
        std::optional<TransportKind>(TransportKind::kShm)}) {
    SCOPED_TRACE(route ? transport_kind_name(*route) : "auto");
    PeerOptions options;
    options.transport = route;
    Result<PeerHandle> peer = engine.open_peer(name, options);
    EXPECT_FALSE(peer.ok());
    if (peer.ok()) {
      for (uint64_t page : {page0, page1}) {
        for (OpKind kind : {OpKind::kWrite, OpKind::kRead}) {
          TransferOp op{kind, reinterpret_cast<uint64_t>(src.data()), page, kPage};
          engine.transfer_sync(*peer, {&op, 1}).ignore();
        }
      }
      continue;
    }
    EXPECT_EQ(peer.status().code(), expected) << peer.status().to_string();
  }
  ASSERT_TRUE(engine.unregister_memory(src.data()).ok());
}

class ForgedDescriptor : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run the attacker as another uid";
  }
  std::string sockets_ = "forged-" + std::to_string(::getpid());
};

TEST_F(ForgedDescriptor, AFakeHandshakeServerCannotSteerARootEngineIntoAThirdProcess) {
  Victim victim;
  FakeHandshakeServer fake(sockets_ + "-v",
                           forged_descriptor("127.0.0.1:1", victim.pid, victim.pages.addr(0),
                                             victim.pages.addr(1), sockets_ + "-v"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator");
  expect_every_route_refused(*engine, fake.endpoint(), victim.pages.addr(0),
                             victim.pages.addr(1), StatusCode::kUnauthenticated);
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

TEST_F(ForgedDescriptor, AFakeHandshakeServerCannotSteerAnEngineIntoItsOwnUnregisteredMemory) {
  SharedPages own;  // this process's memory, registered nowhere
  FakeHandshakeServer fake(sockets_ + "-s", forged_descriptor("127.0.0.1:1", ::getpid(),
                                                              own.addr(0), own.addr(1),
                                                              sockets_ + "-s"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator");
  expect_every_route_refused(*engine, fake.endpoint(), own.addr(0), own.addr(1),
                             StatusCode::kUnauthenticated);
  EXPECT_TRUE(own.untouched()) << "bytes reached this engine's unregistered memory";
}

TEST_F(ForgedDescriptor, AnEngineWithASecretRefusesADescriptorServedWithoutAChallenge) {
  Victim victim;
  FakeHandshakeServer fake(sockets_ + "-k",
                           forged_descriptor("127.0.0.1:1", victim.pid, victim.pages.addr(0),
                                             victim.pages.addr(1), sockets_ + "-k"));
  ASSERT_EQ(fake.ready(), "ready");
  auto engine = testing::make_engine("root-initiator", 2, "engine-secret");
  expect_every_route_refused(*engine, fake.endpoint(), victim.pages.addr(0),
                             victim.pages.addr(1), StatusCode::kUnauthenticated);
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

// A record put under a made-up name by a client with only store access.
class ForgedStoreRecord : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const char* env =
        std::getenv(GetParam() == "etcd" ? "KVFERRY_TEST_ETCD" : "KVFERRY_TEST_REDIS");
    if (env == nullptr) GTEST_SKIP() << GetParam() << " is not running (scripts/services.sh)";
    uri_ = env;
  }
  std::unique_ptr<TransferEngine> engine(std::optional<std::string> secret) {
    EngineOptions o;
    o.name = "root-initiator";
    o.metadata_uri = uri_;
    o.secret = std::move(secret);
    return must(TransferEngine::create(o));
  }
  std::string uri_;
};

TEST_P(ForgedStoreRecord, IsRefusedWithAndWithoutASecretAndNoByteReachesTheVictim) {
  Victim victim;
  const std::string name = "127.0.0.9:" + std::to_string(20000 + ::getpid() % 20000);
  const std::string sockets = "forged-store-" + std::to_string(::getpid());
  const SegmentDescriptor forged =
      forged_descriptor(name, victim.pid, victim.pages.addr(0), victim.pages.addr(1), sockets);
  FakeHandshakeServer sockets_only(sockets, forged);  // serves the named abstract sockets
  ASSERT_EQ(sockets_only.ready(), "ready");
  auto writer = must(open_metadata_store(uri_, MetadataStoreOptions{}));
  ASSERT_TRUE(writer->publish(name, serialize_segment_descriptor(forged)).ok());
  for (std::optional<std::string> secret :
       {std::optional<std::string>(), std::optional<std::string>("store-secret")}) {
    SCOPED_TRACE(secret ? "with a secret" : "without a secret");
    auto e = engine(secret);
    expect_every_route_refused(*e, name, victim.pages.addr(0), victim.pages.addr(1),
                               StatusCode::kUnauthenticated);
  }
  EXPECT_TRUE(victim.pages.untouched()) << "bytes reached the third process";
}

INSTANTIATE_TEST_SUITE_P(Stores, ForgedStoreRecord, ::testing::Values("etcd", "redis"),
                         [](const auto& param_info) { return param_info.param; });

}  // namespace
}  // namespace kvferry
