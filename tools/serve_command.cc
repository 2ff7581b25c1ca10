// `kvferry serve`: a passive peer for tests, benchmarks and the demo. It creates an
// engine, allocates one shared buffer, prints one JSON line
//   {"endpoint": "...", "addr": N, "bytes": N, "pid": N}
// and then answers line commands on stdin, one reply line each:
//   fill SEED OFFSET LEN     fill [addr+OFFSET, +LEN) with the test pattern  -> ok
//   verify SEED OFFSET LEN   check that range against the pattern            -> ok | mismatch AT
//   checksum OFFSET LEN      XXH3 of the range                               -> hex
//   verify-pages SEED PAGE_BYTES  check every whole page of the buffer          -> ok PAGES CORRUPT
//   quit                     (or end of input) exits
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "core/pattern.h"
#include "kvferry/transfer_engine.h"

namespace kvferry::cli {
namespace {

struct ServeArgs {
  uint64_t shared_bytes = 64 << 20;
  std::string listen = "127.0.0.1:0";
  std::string name = "serve";
  int threads = 2;
  std::string metadata = "p2p";
  int metadata_ttl_s = 10;
};

int serve(const ServeArgs& args) {
  EngineOptions options;
  options.name = args.name;
  options.listen_address = args.listen;
  options.worker_threads = args.threads;
  options.metadata_uri = args.metadata;
  options.metadata_ttl = std::chrono::seconds(args.metadata_ttl_s);
  auto engine = TransferEngine::create(options);
  if (!engine.ok()) {
    std::cerr << "kvferry serve: " << engine.status().to_string() << "\n";
    return 1;
  }
  auto buffer = (*engine)->allocate_shared(args.shared_bytes);
  if (!buffer.ok()) {
    std::cerr << "kvferry serve: " << buffer.status().to_string() << "\n";
    return 1;
  }
  auto* base = static_cast<std::byte*>(buffer->addr);
  nlohmann::json hello = {{"endpoint", (*engine)->endpoint()},
                          {"addr", reinterpret_cast<uint64_t>(buffer->addr)},
                          {"bytes", buffer->length},
                          {"pid", ::getpid()}};
  std::cout << hello.dump() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string verb;
    in >> verb;
    uint64_t a = 0;
    uint64_t b = 0;
    uint64_t c = 0;
    auto range_ok = [&](uint64_t offset, uint64_t len) {
      return offset <= buffer->length && len <= buffer->length - offset;
    };
    if (verb == "quit") break;
    if (verb == "fill" && (in >> a >> b >> c) && range_ok(b, c)) {
      fill_pattern({base + b, c}, a, b);
      std::cout << "ok" << std::endl;
    } else if (verb == "verify" && (in >> a >> b >> c) && range_ok(b, c)) {
      auto bad = find_pattern_mismatch({base + b, c}, a, b);
      std::cout << (bad ? fmt::format("mismatch {}", *bad) : std::string("ok")) << std::endl;
    } else if (verb == "verify-pages" && (in >> a >> b) && b > 0) {
      uint64_t pages = buffer->length / b;
      uint64_t corrupt = 0;
      for (uint64_t p = 0; p < pages; ++p) {
        if (find_pattern_mismatch({base + p * b, b}, a, p * b)) ++corrupt;
      }
      std::cout << fmt::format("ok {} {}", pages, corrupt) << std::endl;
    } else if (verb == "checksum" && (in >> a >> b) && range_ok(a, b)) {
      std::cout << fmt::format("{:016x}", checksum({base + a, b})) << std::endl;
    } else {
      std::cout << "error: bad command '" << line << "'" << std::endl;
    }
  }
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd =
      app.add_subcommand("serve", "run a passive peer with one shared buffer (for tests)");
  cmd->add_option("--shared-bytes", args->shared_bytes, "bytes of shared memory to allocate");
  cmd->add_option("--listen", args->listen, "handshake listen address host:port");
  cmd->add_option("--name", args->name, "engine name");
  cmd->add_option("--threads", args->threads, "worker threads");
  cmd->add_option("--metadata", args->metadata, "p2p | etcd://host:port[,...] | redis://host:port");
  cmd->add_option("--metadata-ttl", args->metadata_ttl_s, "seconds a record outlives its engine");
  cmd->callback([args] {
    int rc = serve(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
