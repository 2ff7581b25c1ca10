// ServePeer: starts `kvferry serve` in a child process and reads its hello line. Shared by
// the bench and demo commands and the integration tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/child_process.h"

namespace kvferry::cli {

// The serve child's plain TCP sink (`sink`): a request word with this bit set asks for
// (word & ~kSinkReadFlag) bytes back instead of sending them.
inline constexpr uint64_t kSinkReadFlag = 1ull << 63;
// A connection's first word may be exactly this: from then on the sink polls for its next
// request (`sink_recv`'s hot window) before it blocks, as kvferry's tcp receiver does.
inline constexpr uint64_t kSinkPollWord = 1ull << 62;

struct ServePeer {
  ChildProcess process;
  std::string endpoint;
  uint64_t addr = 0;
  uint64_t bytes = 0;
};

// `launcher` is put in front of the CLI (e.g. `ip netns exec NS` for a peer in a namespace).
inline Result<ServePeer> start_serve_peer(const std::string& cli_path, uint64_t shared_bytes,
                                          const std::vector<std::string>& extra_args = {},
                                          const std::vector<std::string>& launcher = {}) {
  std::vector<std::string> argv = launcher;
  for (std::string part : {cli_path, std::string("serve"), std::string("--shared-bytes"),
                           std::to_string(shared_bytes)}) {
    argv.push_back(std::move(part));
  }
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  KVF_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::spawn(argv));
  KVF_ASSIGN_OR_RETURN(std::string line, child.read_line(std::chrono::seconds(30)));
  auto hello = nlohmann::json::parse(line, nullptr, false);
  if (hello.is_discarded() || !hello.contains("endpoint")) {
    return ProtocolError("kvferry serve said '" + line + "', expected its hello JSON");
  }
  return ServePeer{std::move(child), hello["endpoint"].get<std::string>(),
                   hello["addr"].get<uint64_t>(), hello["bytes"].get<uint64_t>()};
}

// The path of the running executable (for spawning `kvferry serve` from the CLI itself).
std::string self_executable();

}  // namespace kvferry::cli
