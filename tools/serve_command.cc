// `kvferry serve`: a passive peer for tests, benchmarks and the demo. It creates an
// engine, allocates one buffer — shared memory from allocate_shared (`--memory shared`, the
// default), or plain anonymous memory it maps itself and registers (`--memory host`, what
// serving stacks register: reachable from the same host over cma, not shm; `host-thp` also
// advises transparent huge pages, which cma copies 2-4x faster) — prints one
// JSON line
//   {"endpoint": "...", "addr": N, "bytes": N, "pid": N}
// and then answers line commands on stdin, one reply line each:
//   fill SEED OFFSET LEN     fill [addr+OFFSET, +LEN) with the test pattern  -> ok
//   verify SEED OFFSET LEN   check that range against the pattern            -> ok | mismatch AT
//   checksum OFFSET LEN      XXH3 of the range                               -> hex
//   verify-pages SEED PAGE_BYTES  check every whole page of the buffer          -> ok PAGES CORRUPT
//   sink                     start a plain TCP sink (the benchmarks' reference): each
//                            message is a u64 length then that many bytes, received into
//                            the shared buffer, answered with one byte; a length
//                            with kSinkReadFlag is answered with that many bytes; a
//                            connection that opens with kSinkPollWord is served polling
//                            -> ok PORT
//   quit                     (or end of input) exits
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "commands.h"
#include "core/net.h"
#include "core/pattern.h"
#include "host_buffer.h"
#include "kvferry/transfer_engine.h"
#include "serve_client.h"
#include "transport/tcp/tcp_wire.h"

namespace kvferry::cli {
namespace {

struct ServeArgs {
  uint64_t shared_bytes = 64 << 20;
  std::string listen = "127.0.0.1:0";
  std::string name = "serve";
  int threads = 2;
  std::string metadata = "p2p";
  int metadata_ttl_s = 10;
  std::string memory = "shared";  // shared | host | host-thp
};

// The buffer of `--memory host`: anonymous memory, unmapped when serve exits.
// Whole-buffer socket calls for the sink: the reference must be the strongest plain stream,
// so it sleeps in recv(MSG_WAITALL) instead of polling; on a polling connection it first
// polls for `hot` (bounded, like kvferry's receiver: kTcpHotTime), then sleeps.
bool sink_recv(int fd, std::byte* data, uint64_t length,
               std::chrono::microseconds hot = std::chrono::microseconds(0)) {
  const auto hot_until = std::chrono::steady_clock::now() + hot;
  while (length > 0) {
    const bool polling = hot.count() > 0 && std::chrono::steady_clock::now() < hot_until;
    ssize_t n = ::recv(fd, data, length, polling ? MSG_DONTWAIT : MSG_WAITALL);
    if (n < 0 && (errno == EINTR || (polling && errno == EAGAIN))) continue;
    if (n <= 0) return false;
    data += n;
    length -= static_cast<uint64_t>(n);
  }
  return true;
}

bool sink_send(int fd, const std::byte* data, uint64_t length) {
  while (length > 0) {
    ssize_t n = ::send(fd, data, length, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data += n;
    length -= static_cast<uint64_t>(n);
  }
  return true;
}

// A plain single-stream TCP peer: what the tcp transport is measured against. Each request
// is a u64: a length (receive that many bytes into the buffer, answer one byte), or a length
// with kSinkReadFlag (send that many bytes of the buffer back). A connection whose first
// word is kSinkPollWord polls for each next message (see sink_recv).
void serve_sink_connection(Fd conn, std::byte* base, uint64_t capacity) {
  int one = 1;
  ::setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::chrono::microseconds hot{0};
  for (bool first = true;; first = false) {
    uint64_t word = 0;
    if (!sink_recv(conn.get(), reinterpret_cast<std::byte*>(&word), sizeof(word), hot)) return;
    if (first && word == kSinkPollWord) {
      hot = kTcpHotTime;
      continue;
    }
    const bool read = (word & kSinkReadFlag) != 0;
    const uint64_t length = word & ~kSinkReadFlag;
    if (length > capacity) return;
    if (read) {
      if (!sink_send(conn.get(), base, length)) return;
      continue;
    }
    if (!sink_recv(conn.get(), base, length, hot)) return;
    std::byte ack{1};
    if (!sink_send(conn.get(), &ack, 1)) return;
  }
}

// Serves each connection on its own thread (the bench holds a blocking and a polling stream
// at once); they live until their peer closes or the process exits.
void run_sink(Fd listener, std::byte* base, uint64_t capacity) {
  for (;;) {
    int c = ::accept(listener.get(), nullptr, nullptr);
    if (c < 0) return;
    std::thread(serve_sink_connection, Fd(c), base, capacity).detach();
  }
}

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
  std::optional<HostBuffer> host;
  Result<SharedBuffer> buffer = SharedBuffer{};
  if (args.memory == "host" || args.memory == "host-thp") {
    Result<HostBuffer> mapped =
        HostBuffer::map("kvferry serve", args.shared_bytes, args.memory == "host-thp");
    if (!mapped.ok()) {
      std::cerr << mapped.status().to_string() << "\n";
      return 1;
    }
    host.emplace(std::move(*mapped));
    if (Status s = (*engine)->register_memory(host->data(), host->size()); !s.ok()) {
      std::cerr << "kvferry serve: " << s.to_string() << "\n";
      return 1;
    }
    buffer = SharedBuffer{host->data(), host->size()};
  } else {
    buffer = (*engine)->allocate_shared(args.shared_bytes);
  }
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
  std::thread sink;
  Fd sink_listener;
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
    if (verb == "sink" && !sink.joinable()) {
      Endpoint bound;
      auto listener = listen_tcp({parse_endpoint((*engine)->endpoint())->host, 0}, &bound);
      if (!listener.ok()) {
        std::cout << "error: " << listener.status().to_string() << std::endl;
        continue;
      }
      sink_listener = Fd(::dup(listener->get()));
      sink = std::thread(run_sink, std::move(*listener), base, buffer->length);
      std::cout << "ok " << bound.port << std::endl;
      continue;
    }
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
    } else if (verb == "notifications") {
      // The messages received so far, oldest first, each with its sender: "ok sender:msg ...".
      std::string out = "ok";
      for (const Notification& n : (*engine)->get_notifications()) {
        if (n.kind == Notification::Kind::kMessage) out += fmt::format(" {}:{}", n.sender, n.bytes);
      }
      std::cout << out << std::endl;
    } else if (verb == "checksum" && (in >> a >> b) && range_ok(a, b)) {
      std::cout << fmt::format("{:016x}", checksum({base + a, b})) << std::endl;
    } else {
      std::cout << "error: bad command '" << line << "'" << std::endl;
    }
  }
  if (sink.joinable()) {
    ::shutdown(sink_listener.get(), SHUT_RDWR);  // wakes accept()
    sink.detach();  // it may be inside a connection; the process exits next
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
  cmd->add_option("--memory", args->memory,
                  "shared: allocate_shared memory (shm); host: mapped and registered (cma); "
                  "host-thp: host with transparent huge pages advised")
      ->check(CLI::IsMember({"shared", "host", "host-thp"}));
  cmd->callback([args] {
    int rc = serve(*args);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace kvferry::cli
