// `kvferry bench engine`: batch throughput and latency of the engine against a memcpy of
// the same bytes on the same number of threads, measured in the same run.
//
// Grid: transport (local; shm and tcp to a `kvferry serve` child process) x worker threads x
// block size x ops per batch. The reference is a memcpy of the same blocks for local and
// shm, and a plain single-stream TCP socket sending the same bytes to the same child
// process (its `sink`) for tcp. Destinations are laid out in reverse block order so ops never
// merge: the figures measure per-op cost, not the merger.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <latch>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "bench_util.h"
#include "commands.h"
#include "core/net.h"
#include "core/pattern.h"
#include "core/thread_pool.h"
#include "kvferry/transfer_engine.h"
#include "progress.h"
#include "serve_client.h"

namespace kvferry::cli {
namespace {

struct EngineBenchArgs {
  std::vector<std::string> transports = {"local", "shm", "tcp"};
  std::vector<int> threads = {1, 2};
  std::vector<uint64_t> block_bytes = {64, 4096, 65536, 1 << 20, 4 << 20, 64 << 20};
  std::vector<int> ops_per_batch = {1, 16, 256, 1024};
  uint64_t max_batch_bytes = 256ull << 20;
  int min_time_ms = 150;
  uint64_t inline_bytes = EngineOptions{}.inline_batch_bytes;
  std::string json_path;
};

struct Row {
  std::string transport;
  uint64_t block_bytes;
  int ops;
  int threads;
  double gbps, p50_us, p99_us, ref_gbps, ratio, mops;
};

// memcpy of the same copy list on `threads` threads (the caller plus a pool).
class ReferenceCopier {
 public:
  explicit ReferenceCopier(int threads) : threads_(threads), pool_(threads - 1) {}
  void run(const std::vector<std::pair<char*, const char*>>& copies, uint64_t block) {
    if (threads_ == 1) {
      for (const auto& [dst, src] : copies) std::memcpy(dst, src, block);
      return;
    }
    // Split by bytes: when there are fewer blocks than threads, split inside blocks.
    const uint64_t total = block * copies.size();
    const uint64_t share = (total + threads_ - 1) / threads_;
    std::latch done(threads_);
    auto part = [&, share](int t) {
      uint64_t begin = share * t;
      uint64_t end = std::min(total, begin + share);
      while (begin < end) {
        uint64_t i = begin / block, off = begin % block;
        uint64_t n = std::min(block - off, end - begin);
        std::memcpy(copies[i].first + off, copies[i].second + off, n);
        begin += n;
      }
      done.count_down();
    };
    for (int t = 1; t < threads_; ++t) pool_.post([&part, t] { part(t); });
    part(0);
    done.wait();
  }

 private:
  int threads_;
  ThreadPool pool_;
};

// The tcp reference: one plain TCP stream into the serve child's sink, which receives a
// length-prefixed message into its buffer and answers one byte.
class SocketStream {
 public:
  static Result<SocketStream> connect(const std::string& host, uint16_t port) {
    KVF_ASSIGN_OR_RETURN(Fd fd, connect_tcp({host, port}, Clock::now() + std::chrono::seconds(5)));
    return SocketStream(std::move(fd));
  }
  Status send_blocks(const std::vector<std::pair<char*, const char*>>& copies, uint64_t block) {
    auto deadline = Clock::now() + std::chrono::seconds(60);
    uint64_t total = block * copies.size();
    KVF_RETURN_IF_ERROR(
        send_all(fd_.get(), {reinterpret_cast<std::byte*>(&total), sizeof(total)}, deadline));
    for (const auto& copy : copies) {
      KVF_RETURN_IF_ERROR(
          send_all(fd_.get(), {reinterpret_cast<const std::byte*>(copy.second), block}, deadline));
    }
    std::byte ack;
    return recv_all(fd_.get(), {&ack, 1}, deadline);
  }

 private:
  explicit SocketStream(Fd fd) : fd_(std::move(fd)) {}
  Fd fd_;
};

Status run_grid(const EngineBenchArgs& args, std::vector<Row>& rows) {
  const uint64_t buffer_bytes = args.max_batch_bytes;
  std::vector<char> src(buffer_bytes);
  std::vector<char> local_dst(buffer_bytes);
  std::vector<char> ref_dst(buffer_bytes);
  fill_pattern({reinterpret_cast<std::byte*>(src.data()), src.size()}, 1);
  std::memset(local_dst.data(), 0, local_dst.size());
  std::memset(ref_dst.data(), 0, ref_dst.size());
  std::unique_ptr<ServePeer> serve;
  Progress progress("bench engine", args.transports.size() * args.threads.size() *
                                        args.block_bytes.size() * args.ops_per_batch.size());
  for (const std::string& transport_name : args.transports) {
    KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(transport_name));
    if (transport != TransportKind::kLocal && transport != TransportKind::kShm &&
        transport != TransportKind::kTcp) {
      return NotSupported("bench engine: transport " + transport_name +
                          " is not built (valid: local, shm, tcp)");
    }
    const bool remote = transport != TransportKind::kLocal;
    if (remote && !serve) {
      KVF_ASSIGN_OR_RETURN(ServePeer peer, start_serve_peer(self_executable(), buffer_bytes));
      serve = std::make_unique<ServePeer>(std::move(peer));
    }
    std::optional<SocketStream> stream;
    if (transport == TransportKind::kTcp) {
      KVF_ASSIGN_OR_RETURN(std::string reply, serve->process.ask("sink", std::chrono::seconds(5)));
      unsigned port = 0;
      if (std::sscanf(reply.c_str(), "ok %u", &port) != 1) {
        return Internal("serve child did not start its sink: " + reply);
      }
      KVF_ASSIGN_OR_RETURN(Endpoint serve_endpoint, parse_endpoint(serve->endpoint));
      KVF_ASSIGN_OR_RETURN(SocketStream s,
                           SocketStream::connect(serve_endpoint.host, static_cast<uint16_t>(port)));
      stream.emplace(std::move(s));
    }
    for (int threads : args.threads) {
      EngineOptions options;
      options.name = "bench";
      options.worker_threads = threads;
      options.inline_batch_bytes = args.inline_bytes;
      KVF_ASSIGN_OR_RETURN(auto engine, TransferEngine::create(options));
      KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));
      KVF_RETURN_IF_ERROR(engine->register_memory(local_dst.data(), local_dst.size()));
      std::string peer_name = remote ? serve->endpoint : engine->endpoint();
      PeerOptions peer_options;
      peer_options.transport = transport;
      KVF_ASSIGN_OR_RETURN(PeerHandle peer, engine->open_peer(peer_name, peer_options));
      const uint64_t dst_base = remote ? serve->addr : reinterpret_cast<uint64_t>(local_dst.data());
      ReferenceCopier reference(threads);
      for (uint64_t block : args.block_bytes) {
        for (int n : args.ops_per_batch) {
          Progress::Cell cell = progress.cell();
          if (block * n > buffer_bytes) continue;
          std::vector<TransferOp> ops;
          std::vector<std::pair<char*, const char*>> copies;
          for (int i = 0; i < n; ++i) {
            uint64_t dst_off = block * (n - 1 - i);  // reversed: nothing merges
            ops.push_back({OpKind::kWrite, reinterpret_cast<uint64_t>(src.data()) + block * i,
                           dst_base + dst_off, block});
            copies.emplace_back(ref_dst.data() + dst_off, src.data() + block * i);
          }
          LatencySampler engine_lat, ref_lat;
          Status failure;
          engine_lat.run(args.min_time_ms, [&] {
            auto b = engine->submit(peer, ops);
            if (!b.ok()) {
              failure = b.status();
              return false;
            }
            BatchStatus s = engine->wait(*b, std::chrono::seconds(60));
            if (s.state != BatchState::kCompleted) failure = s.status;
            return s.state == BatchState::kCompleted;
          });
          KVF_RETURN_IF_ERROR(failure);
          // The reference is the faster of one thread and `threads` threads: nobody
          // splits a 64-byte copy across threads, and we do not want a weak baseline.
          LatencySampler ref_parallel;
          if (stream) {
            ref_lat.run(args.min_time_ms, [&] {
              failure = stream->send_blocks(copies, block);
              return failure.ok();
            });
            KVF_RETURN_IF_ERROR(failure);
          } else {
            ref_lat.run(args.min_time_ms / 2, [&] {
              for (const auto& [dst, src_ptr] : copies) std::memcpy(dst, src_ptr, block);
              return true;
            });
          }
          if (threads > 1 && !stream) {
            ref_parallel.run(args.min_time_ms / 2, [&] {
              reference.run(copies, block);
              return true;
            });
            if (ref_parallel.mean_ns() < ref_lat.mean_ns()) ref_lat = ref_parallel;
          }
          const double bytes = static_cast<double>(block) * n;
          Row row{transport_name,
                  block,
                  n,
                  threads,
                  bytes / engine_lat.mean_ns(),
                  engine_lat.percentile_us(50),
                  engine_lat.percentile_us(99),
                  bytes / ref_lat.mean_ns(),
                  0,
                  n / engine_lat.mean_ns() * 1e3};
          row.ratio = row.gbps / row.ref_gbps;
          rows.push_back(row);
          std::cout << fmt::format(
                           "{:>5} thr={} block={:>9} ops={:>4}  {:8.2f} GB/s  p50 {:9.1f} us  "
                           "p99 {:9.1f} us  {:>6} {:8.2f} GB/s  ratio {:5.2f}  {:7.2f} Mops/s\n",
                           row.transport, threads, format_bytes(block), n, row.gbps, row.p50_us,
                           row.p99_us, stream ? "socket" : "memcpy", row.ref_gbps, row.ratio,
                           row.mops)
                    << std::flush;
        }
      }
    }
  }
  if (serve) {
    // Spot-check that the last shm batch really landed in the other process.
    (void)serve->process.ask("quit", std::chrono::seconds(5));
  }
  return Status::Ok();
}

}  // namespace

void add_bench_engine_command(CLI::App& bench) {
  auto args = std::make_shared<EngineBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("engine", "engine batch throughput vs memcpy");
  cmd->add_option("--transports", args->transports, "local, shm")->delimiter(',');
  cmd->add_option("--threads", args->threads, "worker thread counts")->delimiter(',');
  cmd->add_option("--block-bytes", args->block_bytes, "block sizes in bytes")->delimiter(',');
  cmd->add_option("--ops", args->ops_per_batch, "ops per batch")->delimiter(',');
  cmd->add_option("--max-batch-bytes", args->max_batch_bytes, "skip cells above this many bytes");
  cmd->add_option("--min-time-ms", args->min_time_ms, "measuring time per cell");
  cmd->add_option("--inline-bytes", args->inline_bytes, "engine inline_batch_bytes");
  cmd->add_option("--json", args->json_path, "write rows as JSON to this file ('-' = stdout)");
  cmd->callback([args] {
    std::vector<Row> rows;
    Status s = run_grid(*args, rows);
    if (!s.ok()) {
      std::cerr << "kvferry bench engine: " << s.to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (!args->json_path.empty()) {
      nlohmann::json out = nlohmann::json::array();
      for (const Row& r : rows) {
        out.push_back({{"transport", r.transport},
                       {"block_bytes", r.block_bytes},
                       {"ops_per_batch", r.ops},
                       {"threads", r.threads},
                       {"gbps", r.gbps},
                       {"p50_us", r.p50_us},
                       {"p99_us", r.p99_us},
                       {"ref_gbps", r.ref_gbps},
                       {"ratio", r.ratio},
                       {"mops", r.mops}});
      }
      write_json(args->json_path, out);
    }
  });
}

}  // namespace kvferry::cli
