// Every thread kvferry starts has a name ("kvf-..."), so that `top -H`, `ps -T` and gdb
// tell them apart from each other and from the host process's (an engine inside python3
// would otherwise add a dozen threads named "python3"). Checked on an engine that serves and
// sends over every host route (tcp, ucx over UCX's tcp, cma); the threads UCX itself starts
// carry UCX's names.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/pattern.h"
#include "kvferry/transport_kind.h"
#include "test_support.h"

namespace kvferry {
namespace {

using testing::must;

// This process's threads: task id -> name.
std::map<std::string, std::string> threads_of_this_process() {
  std::map<std::string, std::string> out;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    out[task.path().filename().string()] = name;
  }
  return out;
}

TEST(ThreadNames, EveryThreadAnEngineStartsIsNamedKvf) {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  const std::map<std::string, std::string> before = threads_of_this_process();
  {
    EngineOptions o;
    o.name = "named";
    o.ucx_allow_emulated = true;
    auto engine = must(TransferEngine::create(o));
    EngineOptions t = o;
    t.name = "named-target";
    auto target = must(TransferEngine::create(t));
    std::vector<std::byte> src(1 << 20), dst(1 << 20);
    fill_pattern(src, 7);
    ASSERT_TRUE(engine->register_memory(src.data(), src.size()).ok());
    ASSERT_TRUE(target->register_memory(dst.data(), dst.size()).ok());
    for (TransportKind kind : {TransportKind::kTcp, TransportKind::kUcx, TransportKind::kCma}) {
      PeerOptions po;
      po.transport = kind;
      PeerHandle peer = must(engine->open_peer(target->endpoint(), po));
      std::fill(dst.begin(), dst.end(), std::byte{0});
      TransferOp op{OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()),
                    reinterpret_cast<uint64_t>(dst.data()), src.size()};
      const std::string_view route = transport_kind_name(kind);
      Status s = engine->transfer_sync(peer, {&op, 1});
      ASSERT_TRUE(s.ok()) << route << ": " << s.to_string();
      EXPECT_EQ(dst, src) << route;
      // A notification starts the sending side's thread too.
      ASSERT_TRUE(engine->send_notification(peer, "hello").ok()) << route;
    }
    // kvferry's threads are "kvf-..."; a library's own (UCX's "async") carry the name the
    // library gave them. None carries the host process's name.
    const std::string host_name = before.at(std::to_string(::getpid()));
    size_t named_kvf = 0;
    for (const auto& [tid, name] : threads_of_this_process()) {
      if (before.count(tid) != 0) continue;
      if (name.rfind("kvf-", 0) == 0) ++named_kvf;
      EXPECT_NE(name, host_name) << "thread " << tid << " was not named";
    }
    EXPECT_GT(named_kvf, 6u);
  }
  ::unsetenv("UCX_TLS");
  ::unsetenv("UCX_NET_DEVICES");
}

}  // namespace
}  // namespace kvferry
