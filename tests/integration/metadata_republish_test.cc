// A descriptor change made while the metadata store is down reaches the store once it is
// back. Each test runs its own etcd or Redis (not the shared one of scripts/services.sh, which
// other tests use meanwhile), kills it, registers memory, restarts it on the same port (etcd:
// the same data directory, so the engine's lease survives and only a re-put can fix the
// record), and waits for the record to show the new region; a second engine then finds the
// region through the store and writes into it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "core/child_process.h"
#include "core/net.h"
#include "core/pattern.h"
#include "metadata/metadata_store.h"
#include "metadata/segment_descriptor.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;

uint16_t free_port() {
  Endpoint bound;
  auto l = listen_tcp({"127.0.0.1", 0}, &bound);
  return l.ok() ? bound.port : 0;
}

// One store server process on fixed ports, restartable.
class StoreServer {
 public:
  enum class Kind { kEtcd, kRedis };
  explicit StoreServer(Kind kind) : kind_(kind) {
    dir_ =
        std::filesystem::temp_directory_path() /
        fmt::format("kvferry-republish-{}-{}", ::getpid(), kind == Kind::kEtcd ? "etcd" : "redis");
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    port_ = free_port();
    peer_port_ = free_port();
  }
  ~StoreServer() {
    stop();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  std::string uri() const {
    return fmt::format("{}://127.0.0.1:{}", kind_ == Kind::kEtcd ? "etcd" : "redis", port_);
  }
  // Starts the server and waits (bounded) until a store client can open it.
  Status start() {
    std::string command;
    if (kind_ == Kind::kEtcd) {
      command = fmt::format(
          "exec etcd --name republish --data-dir {0}/data --listen-client-urls "
          "http://127.0.0.1:{1} --advertise-client-urls http://127.0.0.1:{1} "
          "--listen-peer-urls http://127.0.0.1:{2} --initial-advertise-peer-urls "
          "http://127.0.0.1:{2} --initial-cluster republish=http://127.0.0.1:{2} "
          ">{0}/log 2>&1",
          dir_.string(), port_, peer_port_);
    } else {
      command = fmt::format(
          "exec redis-server --port {1} --bind 127.0.0.1 --save '' --appendonly no --dir {0} "
          ">{0}/log 2>&1",
          dir_.string(), port_);
    }
    KVF_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn({"/bin/sh", "-c", command}));
    process_.emplace(std::move(child));
    MetadataStoreOptions o;
    o.io_timeout = std::chrono::milliseconds(500);
    const auto until = Clock::now() + std::chrono::seconds(20);
    Status last = Internal("not tried");
    while (Clock::now() < until) {
      auto store = open_metadata_store(uri(), o);
      if (store.ok()) return Status::Ok();
      last = store.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return Status(last.code(), "store did not come up: " + last.message());
  }
  void stop() {
    if (process_) process_->kill_now();
    process_.reset();
  }

 private:
  Kind kind_;
  std::filesystem::path dir_;
  uint16_t port_ = 0;
  uint16_t peer_port_ = 0;
  std::optional<ChildProcess> process_;
};

// Whether the store's record of `endpoint` lists a region starting at `addr`.
bool record_lists_region(MetadataStore& store, const std::string& endpoint, uint64_t addr) {
  auto json = store.fetch(endpoint, Clock::now() + std::chrono::seconds(1));
  if (!json.ok()) return false;
  auto d = parse_segment_descriptor(*json);
  if (!d.ok()) return false;
  for (const RegionDescriptor& r : d->regions) {
    if (r.addr == addr) return true;
  }
  return false;
}

class Republish : public ::testing::TestWithParam<StoreServer::Kind> {};

TEST_P(Republish, RegistrationDuringAnOutageIsPublishedOnceTheStoreIsBack) {
  if (std::system("command -v etcd >/dev/null && command -v redis-server >/dev/null") != 0) {
    GTEST_SKIP() << "etcd or redis-server is not installed (scripts/setup.sh installs both)";
  }
  StoreServer server(GetParam());
  ASSERT_TRUE(server.start().ok());
  constexpr auto kTtl = std::chrono::seconds(3);
  auto make = [&](const std::string& name) {
    EngineOptions o;
    o.name = name;
    o.metadata_uri = server.uri();
    o.metadata_ttl = kTtl;
    o.handshake_timeout = std::chrono::milliseconds(500);
    o.forced_transport = TransportKind::kTcp;
    return must(TransferEngine::create(o));
  };
  auto decode = make("decode");
  server.stop();
  constexpr size_t kBytes = 1 << 20;
  std::vector<std::byte> dst(kBytes, std::byte{0});
  // Accepted locally whatever the store says: the store is told later.
  ASSERT_TRUE(decode->register_memory(dst.data(), kBytes).ok());
  ASSERT_TRUE(server.start().ok());
  auto store = must(open_metadata_store(server.uri(), {}));
  const auto back = Clock::now();
  const auto addr = reinterpret_cast<uint64_t>(dst.data());
  // Current within one TTL of the store's return (the keep-alive runs every TTL / 3); the
  // bound here leaves room for a slow machine. Before the fix, the etcd record stayed stale.
  while (!record_lists_region(*store, decode->endpoint(), addr)) {
    ASSERT_LT(Clock::now() - back, 4 * kTtl) << "the record was not republished";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A peer that finds decode through the store reaches the new region.
  auto prefill = make("prefill");
  std::vector<std::byte> src(kBytes);
  fill_pattern(src, 91);
  ASSERT_TRUE(prefill->register_memory(src.data(), kBytes).ok());
  PeerHandle peer = must(prefill->open_peer(decode->endpoint()));
  TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()), addr, kBytes};
  ASSERT_TRUE(prefill->transfer_sync(peer, {&op, 1}).ok());
  EXPECT_FALSE(find_pattern_mismatch(dst, 91));
}

INSTANTIATE_TEST_SUITE_P(Stores, Republish,
                         ::testing::Values(StoreServer::Kind::kEtcd, StoreServer::Kind::kRedis),
                         [](const auto& param_info) {
                           return param_info.param == StoreServer::Kind::kEtcd ? "etcd" : "redis";
                         });

}  // namespace
}  // namespace kvferry
