// The engine's axes of `kvferry bench scale` (bench_scale.h):
//
//  peers        `kvferry serve` children are started once (as many as the largest point
//               asks); each point creates a fresh engine here and opens its first N of them
//               over tcp (PeerOptions). Threads (/proc/self/task), RSS (VmRSS) and fds
//               (/proc/self/fd) of this process are read with the idle engine, after the
//               opens and after one 64 KiB write to each peer (the first batch: its tcp lanes
//               connect then), malloc_trim'd before each reading; per-peer figures are the
//               differences over N. open_peer and the first write are timed per peer
//               (median over peers); then 64 KiB writes round-robin over the peers give the
//               steady-state p50/p99, each followed by the same write over a plain TCP stream
//               to the same child's sink (the reference: what waking N processes in turn
//               costs this host without kvferry). A last write of other bytes is verified in
//               the first and last child.
//  regions      N 4 KiB regions carved from one mapping, registered in one batch and later
//               unregistered in one batch (time per region and in all); the descriptor a
//               peer fetches over the p2p handshake (its bytes, the handshake's p50, the time
//               a peer takes to parse it, and whether it accepts it: peer_parses 0 when the
//               descriptor holds more regions than a peer takes, kMaxDescriptorRegions);
//               a 64-byte local WRITE (the engine to itself) between the first and the last
//               region: submit p50 and submit + wait p50, and submit p50 ÷ the first point's.
//  descriptors  one batch of N 64-byte local ops: merged (destinations in source order, one
//               run), unmerged (reverse order with a 64-byte gap, so no two merge: one
//               pass of the overlap check) and shuffled (the same destinations in a random
//               order: the check sorts them). Each turn runs the batch and then the same
//               copies as a plain loop; turns are measured once they stop getting faster
//               (warm_until_steady): submit, submit + wait and the loop per op (p50 over
//               turns). Every op of one more batch into cleared destinations is verified.
//  inflight     N one-op batches of 4 KiB submitted before the first is waited for, then
//               all waited, over local (the engine to itself: small batches complete inside
//               submit) and tcp (a serve child): the cost per batch (p50 over rounds).
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "bench_scale.h"
#include "bench_util.h"
#include "core/net.h"
#include "core/pattern.h"
#include "host_buffer.h"
#include "kvferry/transfer_engine.h"
#include "metadata/handshake.h"
#include "metadata/segment_descriptor.h"
#include "process_figures.h"
#include "serve_client.h"
#include "socket_stream.h"

namespace kvferry::cli {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr uint64_t kPeerWriteBytes = 64u << 10;
constexpr uint64_t kPeerBufferBytes = 1u << 20;
constexpr uint64_t kRegionBytes = 4096;
constexpr uint64_t kSmallOpBytes = 64;
constexpr uint64_t kInflightOpBytes = 4096;
constexpr auto kHandshakeTimeout = std::chrono::seconds(30);
constexpr auto kServeReplyTimeout = std::chrono::seconds(30);
constexpr auto kWaitTimeout = std::chrono::seconds(60);
constexpr uint64_t kScaleSeed = 0x5ca1e;

std::span<std::byte> bytes_of(const HostBuffer& b) {
  return {reinterpret_cast<std::byte*>(b.data()), b.size()};
}

uint64_t addr_of(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Figures of this process once freed heap has gone back to the system.
ProcessFigures settled_figures() {
  ::malloc_trim(0);
  return read_process_figures();
}

double per(uint64_t after, uint64_t before, uint64_t n) {
  return (static_cast<double>(after) - static_cast<double>(before)) / static_cast<double>(n);
}

Status wait_ok(const TransferEngine& engine, const BatchHandle& batch) {
  BatchStatus s = engine.wait(batch, kWaitTimeout);
  if (s.state == BatchState::kCompleted) return Status::Ok();
  if (!s.status.ok()) return s.status;
  return Timeout("bench scale: a batch did not complete in 60 s");
}

// Submits `ops` as one batch and waits for it, for `min_time_ms` (repeat_for): the time of
// each submit call into `submit_ns`, of submit and wait into `total_ns`.
Status time_batch(TransferEngine& engine, const PeerHandle& peer, std::span<const TransferOp> ops,
                  int min_time_ms, LatencySampler& submit_ns, LatencySampler& total_ns) {
  return repeat_for(min_time_ms, [&](bool record) {
    const auto start = SteadyClock::now();
    KVF_ASSIGN_OR_RETURN(BatchHandle batch, engine.submit(peer, ops));
    const double submitted = ns_since(start);
    KVF_RETURN_IF_ERROR(wait_ok(engine, batch));
    if (record) {
      submit_ns.add(submitted);
      total_ns.add(ns_since(start));
    }
    return Status::Ok();
  });
}

// The child answers "ok" to "verify SEED OFFSET LEN" when the range holds the pattern.
Status verify_in_child(ServePeer& child, uint64_t seed, uint64_t bytes) {
  KVF_ASSIGN_OR_RETURN(
      std::string reply,
      child.process.ask(fmt::format("verify {} 0 {}", seed, bytes), kServeReplyTimeout));
  if (reply != "ok") {
    return DataCorrupted(fmt::format("bench scale: serve child {} says '{}' for the written bytes",
                                     child.endpoint, reply));
  }
  return Status::Ok();
}

// The children of the peers axis: the largest point's worth, started one after another.
Result<std::vector<ServePeer>> start_children(uint64_t n, uint64_t buffer_bytes) {
  std::vector<ServePeer> children;
  children.reserve(n);
  const std::string cli = self_executable();
  for (uint64_t i = 0; i < n; ++i) {
    KVF_ASSIGN_OR_RETURN(ServePeer child, start_serve_peer(cli, buffer_bytes,
                                                           {"--threads", "1", "--name",
                                                            fmt::format("scale-peer-{}", i)}));
    children.push_back(std::move(child));
  }
  return children;
}

}  // namespace

Status run_peers_axis(const ScaleArgs& args, std::vector<ScalePoint>& out) {
  const uint64_t most = *std::max_element(args.peers.begin(), args.peers.end());
  std::cerr << fmt::format("bench scale: starting {} `kvferry serve` children\n", most);
  KVF_ASSIGN_OR_RETURN(std::vector<ServePeer> children, start_children(most, kPeerBufferBytes));
  // The reference: the same 64 KiB write over a plain TCP stream to each child's sink.
  std::vector<SocketStream> plain;
  plain.reserve(most);
  for (ServePeer& child : children) {
    KVF_ASSIGN_OR_RETURN(Endpoint at, parse_endpoint(child.endpoint));
    KVF_ASSIGN_OR_RETURN(std::string reply, child.process.ask("sink", kServeReplyTimeout));
    unsigned port = 0;
    if (std::sscanf(reply.c_str(), "ok %u", &port) != 1) {
      return Internal("bench scale: a serve child did not start its sink: " + reply);
    }
    KVF_ASSIGN_OR_RETURN(SocketStream stream,
                         SocketStream::connect(at.host, static_cast<uint16_t>(port), false));
    plain.push_back(std::move(stream));
  }
  const PeerOptions tcp{.transport = TransportKind::kTcp};
  for (const uint64_t n : args.peers) {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine, make_scale_engine("scale-peers"));
    KVF_ASSIGN_OR_RETURN(HostBuffer src, HostBuffer::map("bench scale", kPeerWriteBytes, false));
    const uint64_t seed = kScaleSeed + n;
    fill_pattern(bytes_of(src), seed);
    KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));
    auto write_to = [&](uint64_t i) {
      return TransferOp{OpKind::kWrite, addr_of(src.data()), children[i].addr, kPeerWriteBytes};
    };

    const ProcessFigures idle = settled_figures();
    std::vector<PeerHandle> peers;  // destroyed before the engine
    LatencySampler open_ns, first_ns, steady_ns, plain_ns;
    const CopyList plain_block = {{nullptr, src.data()}};
    for (uint64_t i = 0; i < n; ++i) {
      const auto t0 = SteadyClock::now();
      KVF_ASSIGN_OR_RETURN(PeerHandle peer, engine->open_peer(children[i].endpoint, tcp));
      open_ns.add(ns_since(t0));
      peers.push_back(std::move(peer));
    }
    const ProcessFigures opened = settled_figures();
    for (uint64_t i = 0; i < n; ++i) {
      const TransferOp op = write_to(i);
      const auto t0 = SteadyClock::now();
      KVF_RETURN_IF_ERROR(engine->transfer_sync(peers[i], std::span(&op, 1)));
      first_ns.add(ns_since(t0));
    }
    const ProcessFigures written = settled_figures();
    // Round-robin over the peers, the engine's write and the plain stream's in turn to the
    // same child; which goes first alternates with each pass over the peers, since the second
    // finds the child's process just run (its caches and its CPU awake).
    uint64_t next = 0;
    const Status measured = repeat_for(
        args.min_time_ms,
        [&](bool record) {
          const uint64_t i = next % n;
          const bool engine_first = (next++ / n) % 2 == 0;
          auto engine_write = [&]() -> Status {
            const TransferOp op = write_to(i);
            const auto t0 = SteadyClock::now();
            KVF_RETURN_IF_ERROR(engine->transfer_sync(peers[i], std::span(&op, 1)));
            if (record) steady_ns.add(ns_since(t0));
            return Status::Ok();
          };
          auto plain_write = [&]() -> Status {
            const auto t0 = SteadyClock::now();
            KVF_RETURN_IF_ERROR(plain[i].write_batch(plain_block, kPeerWriteBytes));
            if (record) plain_ns.add(ns_since(t0));
            return Status::Ok();
          };
          KVF_RETURN_IF_ERROR(engine_first ? engine_write() : plain_write());
          return engine_first ? plain_write() : engine_write();
        },
        n);
    KVF_RETURN_IF_ERROR(measured);
    // The sink received the same bytes: a last engine write of other bytes is what is checked.
    fill_pattern(bytes_of(src), seed + 1);
    for (const uint64_t i : {uint64_t{0}, n - 1}) {
      const TransferOp op = write_to(i);
      KVF_RETURN_IF_ERROR(engine->transfer_sync(peers[i], std::span(&op, 1)));
      KVF_RETURN_IF_ERROR(verify_in_child(children[i], seed + 1, kPeerWriteBytes));
    }
    open_ns.finish();
    first_ns.finish();
    steady_ns.finish();
    plain_ns.finish();

    ScalePoint point{ScaleAxis::kPeers, "tcp", n};
    auto& m = point.metrics;
    m["threads_idle"] = idle.threads;
    m["threads_open"] = opened.threads;
    m["threads"] = written.threads;
    m["threads_per_peer"] = per(written.threads, idle.threads, n);
    m["rss_kib_per_peer"] = per(written.rss_kib, idle.rss_kib, n);
    m["rss_kib_per_peer_open"] = per(opened.rss_kib, idle.rss_kib, n);
    m["fds_per_peer"] = per(written.fds, idle.fds, n);
    m["open_us_p50"] = open_ns.percentile_us(50);
    m["first_write_us_p50"] = first_ns.percentile_us(50);
    m["first_write_us_max"] = first_ns.percentile_us(100);
    m["p50_us"] = steady_ns.percentile_us(50);
    m["p99_us"] = steady_ns.percentile_us(99);
    m["plain_p50_us"] = plain_ns.percentile_us(50);
    m["plain_p99_us"] = plain_ns.percentile_us(99);
    m["p50_vs_plain"] = steady_ns.percentile_us(50) / plain_ns.percentile_us(50);
    add_scale_point(out, std::move(point));
  }
  return Status::Ok();
}

Status run_regions_axis(const ScaleArgs& args, std::vector<ScalePoint>& out) {
  double first_submit_us = 0;
  for (const uint64_t n : args.regions) {
    KVF_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                         make_scale_engine("scale-regions"));
    KVF_ASSIGN_OR_RETURN(HostBuffer area, HostBuffer::map("bench scale", n * kRegionBytes, false));
    std::vector<MemoryRegion> regions(n);
    std::vector<void*> addrs(n);
    for (uint64_t i = 0; i < n; ++i) {
      addrs[i] = area.data() + i * kRegionBytes;
      regions[i] = {addrs[i], kRegionBytes};
    }
    SteadyClock::time_point t0 = SteadyClock::now();
    KVF_RETURN_IF_ERROR(engine->register_memory(regions));
    const double register_ns = ns_since(t0);

    // What a peer fetches: the descriptor over the p2p handshake.
    KVF_ASSIGN_OR_RETURN(Endpoint endpoint, parse_endpoint(engine->endpoint()));
    LatencySampler handshake_ns;
    std::string descriptor;
    const Status fetched = repeat_for(args.min_time_ms, [&](bool record) {
      const auto start = SteadyClock::now();
      KVF_ASSIGN_OR_RETURN(descriptor, fetch_descriptor(endpoint, Clock::now() + kHandshakeTimeout,
                                                        engine->secret()));
      if (record) handshake_ns.add(ns_since(start));
      return Status::Ok();
    });
    KVF_RETURN_IF_ERROR(fetched);
    // What a peer's open_peer does with it next (it may refuse it: kMaxDescriptorRegions).
    t0 = SteadyClock::now();
    const bool parses = parse_segment_descriptor(descriptor).ok();
    const double parse_ns = ns_since(t0);

    // A 64-byte write from the first region into the last (the middle of the region when
    // there is one, so source and destination do not overlap).
    LatencySampler submit_ns, total_ns;
    {
      KVF_ASSIGN_OR_RETURN(PeerHandle self, engine->open_peer(engine->endpoint()));
      const TransferOp op{OpKind::kWrite, addr_of(area.data()),
                          addr_of(area.data()) + (n - 1) * kRegionBytes + kRegionBytes / 2,
                          kSmallOpBytes};
      KVF_RETURN_IF_ERROR(
          time_batch(*engine, self, std::span(&op, 1), args.min_time_ms, submit_ns, total_ns));
      engine->close_peer(self);
    }
    submit_ns.finish();
    total_ns.finish();
    handshake_ns.finish();

    t0 = SteadyClock::now();
    KVF_RETURN_IF_ERROR(engine->unregister_memory(addrs));
    const double unregister_ns = ns_since(t0);

    const double submit_us = submit_ns.percentile_us(50);
    if (first_submit_us == 0) first_submit_us = submit_us;
    ScalePoint point{ScaleAxis::kRegions, "", n};
    auto& m = point.metrics;
    m["register_us_per_region"] = register_ns / 1e3 / static_cast<double>(n);
    m["register_ms"] = register_ns / 1e6;
    m["unregister_us_per_region"] = unregister_ns / 1e3 / static_cast<double>(n);
    m["unregister_ms"] = unregister_ns / 1e6;
    m["descriptor_bytes"] = descriptor.size();
    m["handshake_us_p50"] = handshake_ns.percentile_us(50);
    m["parse_us"] = parse_ns / 1e3;
    m["peer_parses"] = parses ? 1 : 0;
    m["submit_us_p50"] = submit_us;
    m["submit_wait_us_p50"] = total_ns.percentile_us(50);
    m["submit_vs_first"] = first_submit_us > 0 ? submit_us / first_submit_us : 0;
    add_scale_point(out, std::move(point));
  }
  return Status::Ok();
}

Status run_descriptors_axis(const ScaleArgs& args, std::vector<ScalePoint>& out) {
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine,
                       make_scale_engine("scale-descriptors"));
  KVF_ASSIGN_OR_RETURN(PeerHandle self, engine->open_peer(engine->endpoint()));
  enum class Layout : uint8_t { kMerged = 0, kUnmerged, kShuffled };
  for (const uint64_t n : args.descriptors) {
    // Unmerged destinations are 2 x 64 bytes apart: the gap keeps any two from touching.
    KVF_ASSIGN_OR_RETURN(HostBuffer src, HostBuffer::map("bench scale", n * kSmallOpBytes, false));
    KVF_ASSIGN_OR_RETURN(HostBuffer dst,
                         HostBuffer::map("bench scale", 2 * n * kSmallOpBytes, false));
    fill_pattern(bytes_of(src), kScaleSeed + n);
    KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));
    KVF_RETURN_IF_ERROR(engine->register_memory(dst.data(), dst.size()));
    for (const Layout layout : {Layout::kMerged, Layout::kUnmerged, Layout::kShuffled}) {
      std::vector<TransferOp> ops(n);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t at =
            layout == Layout::kMerged ? i * kSmallOpBytes : (n - 1 - i) * 2 * kSmallOpBytes;
        ops[i] = {OpKind::kWrite, addr_of(src.data()) + i * kSmallOpBytes, addr_of(dst.data()) + at,
                  kSmallOpBytes};
      }
      if (layout == Layout::kShuffled) {  // the same destinations in no order
        std::mt19937_64 rng(kScaleSeed + n);
        for (uint64_t i = n; i > 1; --i)
          std::swap(ops[i - 1].remote_addr, ops[rng() % i].remote_addr);
      }
      std::memset(dst.data(), 0, dst.size());
      // A turn: the batch, then the reference (the same copies as a plain loop: what the ops
      // cost without an engine; at a million they are memory-bound, not cache-resident), so
      // both meet the caches in the same state. Turns run until they stop getting faster
      // (warm_until_steady), then are measured.
      LatencySampler submit_ns, total_ns, copy_ns;
      auto turn = [&](bool record) -> Result<double> {
        const auto start = SteadyClock::now();
        KVF_ASSIGN_OR_RETURN(BatchHandle batch, engine->submit(self, ops));
        const double submitted = ns_since(start);
        KVF_RETURN_IF_ERROR(wait_ok(*engine, batch));
        const double total = ns_since(start);
        const auto loop_start = SteadyClock::now();
        for (const TransferOp& op : ops) {
          std::memcpy(reinterpret_cast<void*>(op.remote_addr),
                      reinterpret_cast<const void*>(op.local_addr), op.length);
        }
        const double loop = ns_since(loop_start);
        if (record) {
          submit_ns.add(submitted);
          total_ns.add(total);
          copy_ns.add(loop);
        }
        return total + loop;
      };
      KVF_RETURN_IF_ERROR(warm_until_steady([&] { return turn(false); }));
      KVF_RETURN_IF_ERROR(repeat_for(args.min_time_ms, [&](bool record) {
        if (!record) return Status::Ok();  // warm already
        return turn(true).status();
      }));
      // The plain loop wrote the same bytes: one more batch into cleared destinations is
      // what is checked.
      std::memset(dst.data(), 0, dst.size());
      KVF_ASSIGN_OR_RETURN(BatchHandle checked, engine->submit(self, ops));
      KVF_RETURN_IF_ERROR(wait_ok(*engine, checked));
      for (const TransferOp& op : ops) {
        if (std::memcmp(reinterpret_cast<const void*>(op.remote_addr),
                        reinterpret_cast<const void*>(op.local_addr), op.length) != 0) {
          return DataCorrupted(
              fmt::format("bench scale: descriptors {}: the op to {:#x} did not "
                          "land",
                          n, op.remote_addr));
        }
      }
      submit_ns.finish();
      total_ns.finish();
      copy_ns.finish();
      const double ops_n = static_cast<double>(n);
      constexpr std::array<const char*, 3> kSeries = {"merged", "unmerged", "shuffled"};
      ScalePoint point{ScaleAxis::kDescriptors, kSeries[static_cast<size_t>(layout)], n};
      auto& m = point.metrics;
      m["submit_ns_per_op"] = submit_ns.percentile_us(50) * 1e3 / ops_n;
      m["total_ns_per_op"] = total_ns.percentile_us(50) * 1e3 / ops_n;
      m["copy_loop_ns_per_op"] = copy_ns.percentile_us(50) * 1e3 / ops_n;
      // The engine's own part: what it adds to the copies.
      m["engine_ns_per_op"] =
          (total_ns.percentile_us(50) - copy_ns.percentile_us(50)) * 1e3 / ops_n;
      m["mops"] = ops_n / total_ns.percentile_us(50);
      m["batch_ms_p50"] = total_ns.percentile_us(50) / 1e3;
      m["samples"] = total_ns.count();
      add_scale_point(out, std::move(point));
    }
    KVF_RETURN_IF_ERROR(engine->unregister_memory(src.data()));
    KVF_RETURN_IF_ERROR(engine->unregister_memory(dst.data()));
  }
  engine->close_peer(self);
  return Status::Ok();
}

Status run_inflight_axis(const ScaleArgs& args, std::vector<ScalePoint>& out) {
  const uint64_t most = *std::max_element(args.batches.begin(), args.batches.end());
  const uint64_t dst_bytes = std::max<uint64_t>(most * kInflightOpBytes, kPeerBufferBytes);
  KVF_ASSIGN_OR_RETURN(std::vector<ServePeer> children, start_children(1, dst_bytes));
  ServePeer& child = children.front();
  KVF_ASSIGN_OR_RETURN(std::unique_ptr<TransferEngine> engine, make_scale_engine("scale-inflight"));
  KVF_ASSIGN_OR_RETURN(HostBuffer src, HostBuffer::map("bench scale", kInflightOpBytes, false));
  KVF_ASSIGN_OR_RETURN(HostBuffer local_dst, HostBuffer::map("bench scale", dst_bytes, false));
  fill_pattern(bytes_of(src), kScaleSeed);
  std::memset(local_dst.data(), 0, local_dst.size());
  KVF_RETURN_IF_ERROR(engine->register_memory(src.data(), src.size()));
  KVF_RETURN_IF_ERROR(engine->register_memory(local_dst.data(), local_dst.size()));
  const std::string src_checksum = fmt::format("{:016x}", checksum(bytes_of(src)));

  struct Series {
    std::string name;
    PeerHandle peer;
    uint64_t dst_base;
  };
  std::vector<Series> series;
  {
    KVF_ASSIGN_OR_RETURN(PeerHandle self, engine->open_peer(engine->endpoint()));
    series.push_back({"local", self, addr_of(local_dst.data())});
    KVF_ASSIGN_OR_RETURN(PeerHandle remote,
                         engine->open_peer(child.endpoint, {.transport = TransportKind::kTcp}));
    series.push_back({"tcp", remote, child.addr});
  }
  // Every written block must match the source: locally with memcmp, in the child by checksum.
  auto verify = [&](const Series& s, uint64_t block) -> Status {
    const uint64_t offset = block * kInflightOpBytes;
    if (s.dst_base == addr_of(local_dst.data())) {
      if (std::memcmp(local_dst.data() + offset, src.data(), kInflightOpBytes) == 0) {
        return Status::Ok();
      }
    } else {
      KVF_ASSIGN_OR_RETURN(
          std::string reply,
          child.process.ask(fmt::format("checksum {} {}", offset, kInflightOpBytes),
                            kServeReplyTimeout));
      if (reply == src_checksum) return Status::Ok();
    }
    return DataCorrupted(
        fmt::format("bench scale: inflight {}: block {} did not land", s.name, block));
  };
  for (const Series& s : series) {
    for (const uint64_t n : args.batches) {
      std::vector<TransferOp> ops(n);
      for (uint64_t i = 0; i < n; ++i) {
        ops[i] = {OpKind::kWrite, addr_of(src.data()), s.dst_base + i * kInflightOpBytes,
                  kInflightOpBytes};
      }
      std::vector<BatchHandle> batches(n);
      LatencySampler submit_ns, total_ns;
      const Status measured = repeat_for(args.min_time_ms, [&](bool record) {
        const auto start = SteadyClock::now();
        for (uint64_t i = 0; i < n; ++i) {
          KVF_ASSIGN_OR_RETURN(batches[i], engine->submit(s.peer, std::span(&ops[i], 1)));
        }
        const double submitted = ns_since(start);
        for (const BatchHandle& b : batches) KVF_RETURN_IF_ERROR(wait_ok(*engine, b));
        if (record) {
          submit_ns.add(submitted);
          total_ns.add(ns_since(start));
        }
        return Status::Ok();
      });
      KVF_RETURN_IF_ERROR(measured);
      KVF_RETURN_IF_ERROR(verify(s, 0));
      KVF_RETURN_IF_ERROR(verify(s, n - 1));
      batches.clear();
      submit_ns.finish();
      total_ns.finish();
      const double batches_n = static_cast<double>(n);
      ScalePoint point{ScaleAxis::kInflight, s.name, n};
      auto& m = point.metrics;
      m["submit_us_per_batch"] = submit_ns.percentile_us(50) / batches_n;
      m["total_us_per_batch"] = total_ns.percentile_us(50) / batches_n;
      m["batches_per_s"] = batches_n / total_ns.percentile_us(50) * 1e6;
      m["round_ms_p50"] = total_ns.percentile_us(50) / 1e3;
      m["samples"] = total_ns.count();
      add_scale_point(out, std::move(point));
    }
  }
  for (const Series& s : series) engine->close_peer(s.peer);
  series.clear();
  return Status::Ok();
}

}  // namespace kvferry::cli
