// `kvferry bench engine`: batch throughput and latency of the engine against a reference
// moving the same bytes on the same number of threads, measured in the same run.
//
// Grid: transport (local; the others to a `kvferry serve` child process) x op (write, read) x
// worker threads x block size x ops per batch. The reference is a memcpy of the same blocks
// for the memcpy transports, and for tcp the strongest plain TCP stream between the same two
// processes (the child's `sink`): the whole batch in as few sendmsg calls as the kernel
// allows, one 1-byte acknowledgement per batch (a READ asks with 8 bytes and receives the
// batch straight into its blocks). With one op per batch that reference is the plain
// round trip of one block. A batch of at most kTcpHotRequestBytes also races a polling stream
// (both ends poll for kTcpHotTime before they sleep, as kvferry's tcp does for it); the
// reference is the faster of the two, `polled` in the output when the polling one. cma cells
// have a second reference: the bare process_vm_writev / process_vm_readv of the engine's own
// (local, remote) ranges into the same child, IOV_MAX pairs per call as a direct caller would
// (`bare call`, `ratio/bare`): what the kernel gives anyone, so cma ÷ bare call is kvferry's
// share and bare call ÷ memcpy the kernel's. For tcp the bench also reports CPU-seconds per GB
// and voluntary context switches (wake-ups) per batch, of both processes together, for both
// contestants. With --iperf3, tcp and ucx cells (the socket-referenced ones) also race iperf3
// (single stream on loopback, its default 128 KiB writes and -l 1M) in the same turns, its figures
// from its own reports (iperf3_reference.h): the external reference of the same window. With
// --mooncake, tcp cells also race Mooncake Transfer Engine's own benchmark over its tcp transport
// (connection pool on), its figures from its own reports (mooncake_reference.h).
//
// Method: the engine and its references (memcpy on 1 thread and on `threads` threads, the
// bare call likewise; or the plain stream) take turns in one window, not one after another:
// after a warm-up of each, --rounds rounds (default 5) in which every contestant runs batches
// for --min-time-ms / rounds, the first contestant rotating each round (run_interleaved,
// bench_util.h). A slow spell of a shared machine then hits every contestant alike. Each
// contestant's GB/s is its mean over all its batches, p50/p99 over the same samples; memcpy
// and the bare call each count their faster thread count (by mean); the ratio is engine ÷
// memcpy (or ÷ the stream). CPU and wake-ups are metered around each contestant's turns
// only, summed per contestant. Single-op cells also give p99.9, the engine's and the
// reference's. `--load N` runs N spinning processes beside every contestant (CpuLoad,
// bench_util.h): the contended case, against references contended alike.
//
// Destinations are laid out in reverse block order so ops never merge: the figures measure
// per-op cost, not the merger. Cells above --max-batch-bytes are listed as skipped.
// `--peer-memory host|host-thp` gives the serve child plain registered memory (4 KiB pages)
// or the same with huge pages advised instead of its shared memory (shm needs `shared`);
// `--local-memory host-thp` advises huge pages on this process's buffers (the engine's
// source and destinations and the references'). `--local-memory device` (CUDA builds, tcp)
// sends WRITEs from device memory of cuda:0, and lands READs in it, staged through pinned
// buffers, against the same socket reference; `host,device` runs both in one run, so the rows
// give tcp-with-device-memory / tcp-with-host-memory.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
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
#include "core/fd.h"
#include "core/net.h"
#include "core/pattern.h"
#include "core/thread_pool.h"
#include "host_buffer.h"
#include "iperf3_reference.h"
#include "kvferry/transfer_engine.h"
#include "mooncake_reference.h"
#include "progress.h"
#include "serve_client.h"
#include "socket_stream.h"
#include "transport/built_transports.h"
#include "transport/tcp/tcp_wire.h"
#ifdef KVFERRY_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvferry::cli {
namespace {

// How the bench drives a transport: whether it needs the serve child, and what it is
// measured against. A transport added to the engine gets one line here.
enum class Reference { kMemcpy, kSocket };
struct BenchedTransport {
  TransportKind kind;
  bool remote;  // to the serve child (else: this engine's own memory)
  Reference reference;
};
constexpr BenchedTransport kBenchedTransports[] = {
    {TransportKind::kLocal, false, Reference::kMemcpy},
    {TransportKind::kShm, true, Reference::kMemcpy},
    {TransportKind::kTcp, true, Reference::kSocket},
    {TransportKind::kCma, true, Reference::kMemcpy},
    {TransportKind::kUcx, true, Reference::kSocket},
};

// The transports this build has and the bench can drive (host memory: cuda_ipc is not here).
std::vector<BenchedTransport> benchable_transports() {
  std::vector<BenchedTransport> out;
  for (const BuiltTransport& built : built_transports()) {
    for (const BenchedTransport& b : kBenchedTransports) {
      if (b.kind == built.kind) out.push_back(b);
    }
  }
  return out;
}

std::string benchable_names() {
  std::string names;
  for (const BenchedTransport& b : benchable_transports()) {
    if (!names.empty()) names += ", ";
    names += transport_kind_name(b.kind);
  }
  return names;
}

// The largest block or buffer the bench takes (1 TiB): the options' upper bound.
inline constexpr uint64_t kMaxBenchBytes = uint64_t{1} << 40;

struct EngineBenchArgs {
  std::vector<std::string> transports = {"local", "shm", "tcp"};
  std::vector<std::string> op_names = {"write"};
  std::vector<int> threads = {1, 2};
  std::vector<uint64_t> block_bytes = {64, 4096, 65536, 1 << 20, 4 << 20, 64 << 20};
  std::vector<int> ops_per_batch = {1, 16, 128, 1024};
  // 4 MiB x 128 fits; larger cells are printed as skipped.
  uint64_t max_batch_bytes = 512ull << 20;
  int min_time_ms = 150;
  uint64_t inline_bytes = EngineOptions{}.inline_batch_bytes;
  std::string json_path;
  std::vector<std::string> local_memory = {"host"};
  std::string peer_memory = "shared";  // the serve child's --memory
  int rounds = 5;
  std::string iperf3;  // the iperf3 binary: races it in tcp and ucx cells ("" = not)
  unsigned iperf3_port = 9160;
  std::string mooncake;     // Mooncake's transfer_engine_bench: races it in tcp cells ("" = not)
  int load = 0;             // busy processes beside the contestants (CpuLoad)
  double mark_slow_us = 0;  // SlowOpMarker's threshold (0: off)
};

// --mark-slow-us: a line in the kernel's trace buffer (ftrace's trace_marker) for each engine
// op slower than the threshold, with when it began on CLOCK_MONOTONIC (steady_clock here; the
// trace's own clock once `mono` is written to trace_clock). Traced beside scheduler events
// (sched_switch, sched_wakeup), it shows what every thread of both processes did while that
// op waited: how the slow single ops under load were found.
class SlowOpMarker {
 public:
  static constexpr const char* kPath = "/sys/kernel/tracing/trace_marker";
  static Result<SlowOpMarker> open(double threshold_us) {
    SlowOpMarker m;
    if (threshold_us <= 0) return m;
    m.fd_ = Fd(::open(kPath, O_WRONLY | O_CLOEXEC));
    if (!m.fd_.valid()) {
      return ErrnoStatus(StatusCode::kInvalidArgument,
                         fmt::format("--mark-slow-us needs {} (tracefs mounted, root)", kPath),
                         errno);
    }
    m.threshold_ = std::chrono::nanoseconds(static_cast<int64_t>(threshold_us * 1e3));
    return m;
  }
  // After an op that began at `began`.
  void after(std::chrono::steady_clock::time_point began) const {
    if (!fd_.valid()) return;
    const auto took = std::chrono::steady_clock::now() - began;
    if (took <= threshold_) return;
    const int64_t start_ns = began.time_since_epoch().count();
    const std::string line =
        fmt::format("kvferry slow op: {:.1f} us from {}.{:09}\n", took.count() / 1e3,
                    start_ns / 1'000'000'000, start_ns % 1'000'000'000);
    [[maybe_unused]] ssize_t n = ::write(fd_.get(), line.data(), line.size());
  }

 private:
  Fd fd_;
  std::chrono::steady_clock::duration threshold_{};
};

// The bench's own buffers for one local memory kind: the pattern source, the engine's local
// destination and the memcpy reference's destination.
struct LocalBuffers {
  HostBuffer src, local_dst, ref_dst;
  static Result<LocalBuffers> make(uint64_t bytes, bool huge_pages) {
    KVF_ASSIGN_OR_RETURN(HostBuffer src, HostBuffer::map("bench engine", bytes, huge_pages));
    KVF_ASSIGN_OR_RETURN(HostBuffer local_dst, HostBuffer::map("bench engine", bytes, huge_pages));
    KVF_ASSIGN_OR_RETURN(HostBuffer ref_dst, HostBuffer::map("bench engine", bytes, huge_pages));
    // Touched once, so no batch pays the page faults.
    std::memset(local_dst.data(), 0, bytes);
    std::memset(ref_dst.data(), 0, bytes);
    fill_pattern({reinterpret_cast<std::byte*>(src.data()), src.size()}, 1);
    return LocalBuffers{std::move(src), std::move(local_dst), std::move(ref_dst)};
  }
};

// The engine's source buffer: the host vector itself, or a copy of it in device memory.
class SourceBuffer {
 public:
  static Result<SourceBuffer> make(const std::string& memory, const HostBuffer& host) {
    SourceBuffer b;
    if (memory == "host" || memory == "host-thp") {
      b.addr_ = host.data();
      return b;
    }
    if (memory != "device") {
      return InvalidArgument("bench engine: --local-memory " + memory +
                             " (valid: host, host-thp, device)");
    }
#ifdef KVFERRY_WITH_CUDA
    void* p = nullptr;
    if (cudaError_t e = cudaMalloc(&p, host.size()); e != cudaSuccess) {
      return NotSupported(std::string("bench engine: --local-memory device: cudaMalloc: ") +
                          cudaGetErrorString(e));
    }
    b.device_ = true;
    b.addr_ = static_cast<char*>(p);
    if (cudaError_t e = cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice);
        e != cudaSuccess) {
      return Internal(std::string("bench engine: cudaMemcpy: ") + cudaGetErrorString(e));
    }
    return b;
#else
    return NotSupported("bench engine: --local-memory device needs a CUDA build");
#endif
  }
  SourceBuffer(SourceBuffer&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), device_(o.device_) {}
  SourceBuffer& operator=(SourceBuffer&&) = delete;
  SourceBuffer(const SourceBuffer&) = delete;
  SourceBuffer& operator=(const SourceBuffer&) = delete;
  ~SourceBuffer() {
#ifdef KVFERRY_WITH_CUDA
    if (device_ && addr_ != nullptr) cudaFree(addr_);
#endif
  }
  char* data() const { return addr_; }
  bool device() const { return device_; }
  MemoryLocation location() const {
    return device_ ? MemoryLocation{MemoryLocation::Kind::kCuda, 0} : MemoryLocation{};
  }

 private:
  SourceBuffer() = default;
  char* addr_ = nullptr;
  bool device_ = false;
};

struct Row {
  // With "(dev)" when the source is device memory, "(thp)" when this process's buffers have
  // huge pages advised.
  std::string transport;
  std::string op;
  uint64_t block_bytes;
  int ops;
  int threads;
  std::string local_memory, peer_memory;  // peer: the serve child's --memory ("" for local)
  double gbps = 0, p50_us = 0, p99_us = 0, ref_gbps = 0, ref_p50_us = 0, ref_p99_us = 0, ratio = 0,
         p50_ratio = 0, mops = 0;
  double p999_us = 0, ref_p999_us = 0;  // single-op cells only (0 elsewhere)
  // tcp only (0 elsewhere): both processes together, per GB moved and per batch.
  double cpu_s_per_gb = 0, ref_cpu_s_per_gb = 0, switches_per_batch = 0, ref_switches_per_batch = 0;
  // tcp batches of at most kTcpHotRequestBytes (0 elsewhere): p50 of the blocking and of the
  // polling socket stream; the reference is the faster of the two by mean.
  double socket_p50_us = 0, polled_p50_us = 0;
  // cma only (0 elsewhere): the bare system call's GB/s and p50, and engine ÷ bare call.
  double bare_gbps = 0, bare_p50_us = 0, bare_ratio = 0;
  // tcp and ucx with --iperf3 (0 elsewhere): iperf3 in the same turns, its default 128 KiB writes
  // and -l 1M: GB/s and CPU-s/GB from its own reports.
  double iperf3_gbps = 0, iperf3_cpu_s_per_gb = 0, iperf3_1m_gbps = 0, iperf3_1m_cpu_s_per_gb = 0;
  // tcp with --mooncake (0 elsewhere): Mooncake's benchmark in the same turns, from its own
  // reports: GB/s, and its mean time per batch (it reports no distribution).
  double mooncake_gbps = 0, mooncake_mean_us = 0;
};

// One contiguous piece of a copy: n bytes from src to dst.
struct Piece {
  char* dst;
  const char* src;
  uint64_t n;
};

// The copy list split into `parts` runs of (nearly) equal bytes, in order; with fewer blocks
// than parts, blocks are split too.
std::vector<std::vector<Piece>> split_evenly(const CopyList& copies, uint64_t block, int parts) {
  std::vector<std::vector<Piece>> out(parts);
  const uint64_t total = block * copies.size();
  const uint64_t share = (total + parts - 1) / parts;
  for (int t = 0; t < parts; ++t) {
    uint64_t begin = share * t;
    const uint64_t end = std::min(total, begin + share);
    while (begin < end) {
      const uint64_t i = begin / block, off = begin % block;
      const uint64_t n = std::min(block - off, end - begin);
      out[t].push_back({copies[i].first + off, copies[i].second + off, n});
      begin += n;
    }
  }
  return out;
}

// Runs part(0 .. parts-1) at once: part 0 on the calling thread, the others on the pool.
template <typename F>
void run_parts(ThreadPool& pool, int parts, const F& part) {
  if (parts == 1) {
    part(0);
    return;
  }
  std::latch done(parts - 1);
  for (int t = 1; t < parts; ++t) {
    auto run = [&part, &done, t] {
      part(t);
      done.count_down();
    };
    if (!pool.post(run).ok()) run();  // no thread: here
  }
  part(0);
  done.wait();
}

// memcpy of the same copy list on one thread, and split by bytes over `threads` threads (the
// caller plus the pool).
class ReferenceCopier {
 public:
  ReferenceCopier(ThreadPool& pool, const CopyList& copies, uint64_t block, int threads)
      : pool_(pool), copies_(copies), block_(block), parts_(split_evenly(copies, block, threads)) {}
  void run_one_thread() const {
    for (const auto& [dst, src] : copies_) std::memcpy(dst, src, block_);
  }
  void run_all_threads() const {
    run_parts(pool_, static_cast<int>(parts_.size()), [this](int t) {
      for (const Piece& p : parts_[t]) std::memcpy(p.dst, p.src, p.n);
    });
  }

 private:
  ThreadPool& pool_;
  const CopyList& copies_;
  uint64_t block_;
  std::vector<std::vector<Piece>> parts_;
};

// cma's bare-call reference: the engine's own (local, remote) ranges moved with
// process_vm_writev (WRITE) or process_vm_readv (READ) straight to the serve child, IOV_MAX
// pairs per call, on one thread, and split by bytes over `threads` threads. The iovec lists
// are built once, outside the timed calls.
class VmCallReference {
 public:
  // ops: the engine's batch (each op's remote address is in the child `pid`).
  VmCallReference(ThreadPool& pool, pid_t pid, const std::vector<TransferOp>& ops, int threads)
      : pool_(pool), pid_(pid), write_(ops.front().kind == OpKind::kWrite) {
    // As a copy list: (remote, local) pairs; split_evenly keeps the two sides in step.
    CopyList pairs;
    for (const TransferOp& op : ops) {
      pairs.emplace_back(reinterpret_cast<char*>(op.remote_addr),
                         reinterpret_cast<const char*>(op.local_addr));
    }
    const uint64_t block = ops.front().length;
    one_ = lists(split_evenly(pairs, block, 1));
    all_ = lists(split_evenly(pairs, block, threads));
  }
  Status run_one_thread() { return move(one_.front()); }
  Status run_all_threads() {
    std::vector<Status> results(all_.size());
    run_parts(pool_, static_cast<int>(all_.size()),
              [this, &results](int t) { results[t] = move(all_[t]); });
    for (Status& r : results) KVF_RETURN_IF_ERROR(r);
    return Status::Ok();
  }

 private:
  struct Lists {
    std::vector<iovec> local, remote;
    uint64_t bytes = 0;
  };
  static std::vector<Lists> lists(const std::vector<std::vector<Piece>>& parts) {
    std::vector<Lists> out;
    for (const auto& part : parts) {
      Lists l;
      for (const Piece& p : part) {
        l.remote.push_back({p.dst, p.n});
        l.local.push_back({const_cast<char*>(p.src), p.n});
        l.bytes += p.n;
      }
      out.push_back(std::move(l));
    }
    return out;
  }
  Status move(const Lists& l) const {
    uint64_t moved = 0;
    for (size_t first = 0; first < l.local.size(); first += IOV_MAX) {
      const size_t count = std::min<size_t>(l.local.size() - first, IOV_MAX);
      ssize_t n;
      do {
        n = write_ ? ::process_vm_writev(pid_, &l.local[first], count, &l.remote[first], count, 0)
                   : ::process_vm_readv(pid_, &l.local[first], count, &l.remote[first], count, 0);
      } while (n < 0 && errno == EINTR);
      if (n < 0) {
        return ErrnoStatus(StatusCode::kInternal,
                           fmt::format("bench engine: bare {} to pid {}",
                                       write_ ? "process_vm_writev" : "process_vm_readv", pid_),
                           errno);
      }
      moved += static_cast<uint64_t>(n);
    }
    // A short count means a range the child does not map: the reference is broken, say so.
    if (moved != l.bytes) {
      return Internal(fmt::format("bench engine: bare call moved {} of {} bytes", moved, l.bytes));
    }
    return Status::Ok();
  }

  ThreadPool& pool_;
  pid_t pid_;
  bool write_;
  std::vector<Lists> one_, all_;
};

// The index of the faster (by mean) of two samplers of one reference, or the first when
// there is one.
size_t faster(const std::vector<LatencySampler>& samples, size_t first,
              std::optional<size_t> second) {
  return second && samples[*second].mean_ns() < samples[first].mean_ns() ? *second : first;
}

Status run_grid(const EngineBenchArgs& args, std::vector<Row>& rows) {
  const uint64_t buffer_bytes = args.max_batch_bytes;
  KVF_ASSIGN_OR_RETURN(const SlowOpMarker marker, SlowOpMarker::open(args.mark_slow_us));
  for (const std::string& memory : args.local_memory) {
    if (memory != "host" && memory != "host-thp" && memory != "device") {
      return InvalidArgument("bench engine: --local-memory " + memory +
                             " (valid: host, host-thp, device)");
    }
  }
  std::vector<OpKind> op_kinds;
  for (const std::string& name : args.op_names) {
    if (name == "write") {
      op_kinds.push_back(OpKind::kWrite);
    } else if (name == "read") {
      op_kinds.push_back(OpKind::kRead);
    } else {
      return InvalidArgument("bench engine: --op " + name + " (valid: write, read)");
    }
  }
  // This process's buffers, one set per page kind asked for (host and device share one).
  std::optional<LocalBuffers> plain_buffers, thp_buffers;
  std::unique_ptr<ServePeer> serve;
  unsigned sink_port = 0;
  std::unique_ptr<Iperf3Server> iperf3;
  const std::vector<BenchedTransport> benchable = benchable_transports();
  // Every transport with every local memory kind (device: tcp only).
  std::vector<std::pair<std::string, std::string>> cells;
  for (const std::string& memory : args.local_memory) {
    for (const std::string& t : args.transports) cells.emplace_back(t, memory);
  }
  Progress progress("bench engine", cells.size() * args.threads.size() * op_kinds.size() *
                                        args.block_bytes.size() * args.ops_per_batch.size());
  for (const auto& [plain_transport_name, memory] : cells) {
    KVF_ASSIGN_OR_RETURN(TransportKind transport, parse_transport_kind(plain_transport_name));
    const bool huge_pages = memory == "host-thp";
    std::optional<LocalBuffers>& buffers = huge_pages ? thp_buffers : plain_buffers;
    if (!buffers) {
      KVF_ASSIGN_OR_RETURN(LocalBuffers b, LocalBuffers::make(buffer_bytes, huge_pages));
      buffers.emplace(std::move(b));
    }
    KVF_ASSIGN_OR_RETURN(SourceBuffer engine_src, SourceBuffer::make(memory, buffers->src));
    if (engine_src.device() && transport != TransportKind::kTcp) {
      return NotSupported("bench engine: --local-memory device is for tcp only, not " +
                          plain_transport_name);
    }
    if (transport == TransportKind::kShm && args.peer_memory != "shared") {
      return InvalidArgument(
          "bench engine: shm reaches only the serve child's shared memory, not "
          "--peer-memory " +
          args.peer_memory);
    }
    std::string transport_name = plain_transport_name;
    if (engine_src.device()) transport_name += "(dev)";
    if (huge_pages) transport_name += "(thp)";
    auto how = std::find_if(benchable.begin(), benchable.end(),
                            [&](const BenchedTransport& b) { return b.kind == transport; });
    if (how == benchable.end()) {
      return NotSupported("bench engine: transport " + transport_name +
                          " is not built or not benchable here (valid: " + benchable_names() + ")");
    }
    const bool remote = how->remote;
    if (remote && !serve) {
      KVF_ASSIGN_OR_RETURN(ServePeer peer, start_serve_peer(self_executable(), buffer_bytes,
                                                            {"--memory", args.peer_memory}));
      serve = std::make_unique<ServePeer>(std::move(peer));
    }
    std::cout << fmt::format("# {}: local memory {}{}; {} rounds of {} ms per contestant\n",
                             transport_name, memory,
                             remote ? ", serve child memory " + args.peer_memory : "", args.rounds,
                             args.min_time_ms / args.rounds);
    std::optional<SocketStream> stream, hot_stream;
    if (how->reference == Reference::kSocket) {
      if (sink_port == 0) {  // the child starts one sink; later streams connect to it again
        KVF_ASSIGN_OR_RETURN(std::string reply,
                             serve->process.ask("sink", std::chrono::seconds(5)));
        if (std::sscanf(reply.c_str(), "ok %u", &sink_port) != 1) {
          return Internal("serve child did not start its sink: " + reply);
        }
      }
      const unsigned port = sink_port;
      KVF_ASSIGN_OR_RETURN(Endpoint serve_endpoint, parse_endpoint(serve->endpoint));
      for (bool hot : {false, true}) {
        KVF_ASSIGN_OR_RETURN(
            SocketStream s,
            SocketStream::connect(serve_endpoint.host, static_cast<uint16_t>(port), hot));
        (hot ? hot_stream : stream).emplace(std::move(s));
      }
      if (!args.iperf3.empty() && !iperf3) {
        KVF_ASSIGN_OR_RETURN(iperf3, Iperf3Server::start(args.iperf3, args.iperf3_port));
      }
    }
    char* const local_dst = buffers->local_dst.data();
    char* const ref_dst = buffers->ref_dst.data();
    const char* const src = buffers->src.data();
    for (int threads : args.threads) {
      EngineOptions options;
      options.name = "bench";
      options.worker_threads = threads;
      options.inline_batch_bytes = args.inline_bytes;
      KVF_ASSIGN_OR_RETURN(auto engine, TransferEngine::create(options));
      KVF_RETURN_IF_ERROR(
          engine->register_memory(engine_src.data(), buffer_bytes, engine_src.location()));
      KVF_RETURN_IF_ERROR(engine->register_memory(local_dst, buffer_bytes));
      std::string peer_name = remote ? serve->endpoint : engine->endpoint();
      PeerOptions peer_options;
      peer_options.transport = transport;
      KVF_ASSIGN_OR_RETURN(PeerHandle peer, engine->open_peer(peer_name, peer_options));
      const uint64_t remote_base = remote ? serve->addr : reinterpret_cast<uint64_t>(src);
      ThreadPool pool(threads - 1);  // the references' extra threads
      for (OpKind op_kind : op_kinds) {
        const std::string op_name = op_kind == OpKind::kWrite ? "write" : "read";
        for (uint64_t block : args.block_bytes) {
          for (int n : args.ops_per_batch) {
            Progress::Cell cell = progress.cell();
            if (block * n > buffer_bytes) {
              std::cout << fmt::format(
                  "{:>5} {:>5} thr={} block={:>9} ops={:>4}  skipped: {} per batch is more than "
                  "--max-batch-bytes {}\n",
                  transport_name, op_name, threads, format_bytes(block), n, format_bytes(block * n),
                  format_bytes(buffer_bytes));
              continue;
            }
            std::vector<TransferOp> ops;
            CopyList copies;
            for (int i = 0; i < n; ++i) {
              const uint64_t far_off = block * (n - 1 - i);  // reversed: nothing merges
              if (op_kind == OpKind::kWrite) {
                ops.push_back(
                    {OpKind::kWrite, reinterpret_cast<uint64_t>(engine_src.data()) + block * i,
                     (remote ? remote_base : reinterpret_cast<uint64_t>(local_dst)) + far_off,
                     block});
              } else {
                // With device memory, READs land in it (the device buffer, as large).
                char* into = engine_src.device() ? engine_src.data() : local_dst;
                ops.push_back({OpKind::kRead, reinterpret_cast<uint64_t>(into) + far_off,
                               remote_base + block * i, block});
              }
              copies.emplace_back(ref_dst + far_off, src + block * i);
            }

            // The contestants: the engine first, then its references.
            Status failure;
            std::vector<std::function<bool()>> contestants;
            contestants.push_back([&] {
              const auto began = std::chrono::steady_clock::now();
              auto b = engine->submit(peer, ops);
              if (!b.ok()) {
                failure = b.status();
                return false;
              }
              BatchStatus s = engine->wait(*b, std::chrono::seconds(60));
              marker.after(began);
              if (s.state != BatchState::kCompleted) failure = s.status;
              return s.state == BatchState::kCompleted;
            });
            // memcpy and the bare call count the faster of one thread and `threads` threads:
            // nobody splits a 64-byte copy across threads, and we do not want a weak baseline.
            ReferenceCopier copier(pool, copies, block, threads);
            std::optional<VmCallReference> bare;
            // The reference's two forms (memcpy: one thread, all threads; tcp: the blocking
            // stream, the polling one) and the bare call's.
            size_t ref_one = 0, bare_one = 0;
            std::optional<size_t> ref_all, bare_all;
            if (stream) {
              auto socket_turn = [&](SocketStream& s) {
                return [&] {
                  failure = op_kind == OpKind::kWrite ? s.write_batch(copies, block)
                                                      : s.read_batch(copies, block);
                  return failure.ok();
                };
              };
              ref_one = contestants.size();
              contestants.push_back(socket_turn(*stream));
              // A lone small exchange also races the polling stream (what kvferry's tcp
              // does for it): the reference is the faster of the two.
              if (block * n <= kTcpHotRequestBytes) {
                ref_all = contestants.size();
                contestants.push_back(socket_turn(*hot_stream));
              }
            } else {
              ref_one = contestants.size();
              contestants.push_back([&] {
                copier.run_one_thread();
                return true;
              });
              if (threads > 1) {
                ref_all = contestants.size();
                contestants.push_back([&] {
                  copier.run_all_threads();
                  return true;
                });
              }
            }
            // iperf3 in the same turns (--iperf3): its default writes, then -l 1M. Its runs
            // count once the measured rounds begin.
            const double turn_ms = static_cast<double>(args.min_time_ms) / args.rounds;
            bool measuring = false;
            std::vector<std::unique_ptr<Iperf3Contestant>> iperf3_runs;
            if (stream && iperf3) {
              for (uint64_t length : {uint64_t{0}, uint64_t{1} << 20}) {
                Iperf3Contestant* c =
                    iperf3_runs
                        .emplace_back(std::make_unique<Iperf3Contestant>(*iperf3, length, turn_ms))
                        .get();
                contestants.push_back([&failure, &measuring, c] {
                  failure = c->run(measuring);
                  return failure.ok();
                });
              }
            }
            // Mooncake in the same turns (--mooncake, tcp cells): one target for the cell.
            std::unique_ptr<MooncakeContestant> mooncake;
            if (stream && transport == TransportKind::kTcp && !args.mooncake.empty()) {
              KVF_ASSIGN_OR_RETURN(
                  mooncake, MooncakeContestant::start(args.mooncake, {op_name, block, n, threads}));
              contestants.push_back([&failure, &measuring, c = mooncake.get()] {
                failure = c->run(measuring);
                return failure.ok();
              });
            }
            if (transport == TransportKind::kCma) {
              bare.emplace(pool, serve->process.pid(), ops, threads);
              bare_one = contestants.size();
              contestants.push_back([&] {
                failure = bare->run_one_thread();
                return failure.ok();
              });
              if (threads > 1) {
                bare_all = contestants.size();
                contestants.push_back([&] {
                  failure = bare->run_all_threads();
                  return failure.ok();
                });
              }
            }

            // CPU and wake-ups of each contestant's turns (tcp: both processes).
            const bool measure_cpu = stream.has_value();
            std::vector<CpuMeter> meters(contestants.size(),
                                         CpuMeter(::getpid(), serve ? serve->process.pid() : -1));
            InterleaveOptions interleave;
            interleave.min_time_ms = args.min_time_ms * static_cast<int>(contestants.size());
            interleave.min_rounds = static_cast<size_t>(args.rounds);
            interleave.turn_ms = turn_ms;
            interleave.warmup_ms = std::min(interleave.turn_ms, 10.0);
            if (measure_cpu) {
              interleave.before_turn = [&](size_t i) {
                measuring = true;
                meters[i].start();
              };
              interleave.after_turn = [&](size_t i, size_t) { meters[i].stop(); };
            }
            std::vector<LatencySampler> samples = run_interleaved(interleave, contestants);
            KVF_RETURN_IF_ERROR(failure);

            const double bytes = static_cast<double>(block) * n;
            const LatencySampler& engine_lat = samples[0];
            const size_t ref = faster(samples, ref_one, ref_all);
            const LatencySampler& ref_lat = samples[ref];
            Row row{
                transport_name, op_name, block, n, threads, memory, remote ? args.peer_memory : ""};
            row.gbps = bytes / engine_lat.mean_ns();
            row.p50_us = engine_lat.percentile_us(50);
            row.p99_us = engine_lat.percentile_us(99);
            row.ref_gbps = bytes / ref_lat.mean_ns();
            row.ref_p50_us = ref_lat.percentile_us(50);
            row.ref_p99_us = ref_lat.percentile_us(99);
            if (n == 1) {
              row.p999_us = engine_lat.percentile_us(99.9);
              row.ref_p999_us = ref_lat.percentile_us(99.9);
            }
            row.ratio = row.gbps / row.ref_gbps;
            row.p50_ratio = row.p50_us / row.ref_p50_us;
            row.mops = n / engine_lat.mean_ns() * 1e3;
            if (measure_cpu) {
              auto per_gb = [&](size_t i) {
                return meters[i].cpu_s() / (static_cast<double>(samples[i].count()) * bytes / 1e9);
              };
              auto per_batch = [&](size_t i) {
                return static_cast<double>(meters[i].switches()) /
                       static_cast<double>(samples[i].count());
              };
              row.cpu_s_per_gb = per_gb(0);
              row.switches_per_batch = per_batch(0);
              row.ref_cpu_s_per_gb = per_gb(ref);
              row.ref_switches_per_batch = per_batch(ref);
              if (ref_all) {
                row.socket_p50_us = samples[ref_one].percentile_us(50);
                row.polled_p50_us = samples[*ref_all].percentile_us(50);
              }
            }
            if (!iperf3_runs.empty()) {
              row.iperf3_gbps = iperf3_runs[0]->tally().gbps();
              row.iperf3_cpu_s_per_gb = iperf3_runs[0]->tally().cpu_s_per_gb();
              row.iperf3_1m_gbps = iperf3_runs[1]->tally().gbps();
              row.iperf3_1m_cpu_s_per_gb = iperf3_runs[1]->tally().cpu_s_per_gb();
            }
            if (mooncake) {
              row.mooncake_gbps = mooncake->gbps();
              row.mooncake_mean_us = mooncake->mean_us();
            }
            if (bare) {
              const LatencySampler& bare_lat = samples[faster(samples, bare_one, bare_all)];
              row.bare_gbps = bytes / bare_lat.mean_ns();
              row.bare_p50_us = bare_lat.percentile_us(50);
              row.bare_ratio = row.gbps / row.bare_gbps;
            }
            rows.push_back(row);
            std::string line = fmt::format(
                "{:>5} {:>5} thr={} block={:>9} ops={:>4}  {:8.2f} GB/s  p50 {:9.1f} us  "
                "p99 {:9.1f} us  {:>6} {:8.2f} GB/s p50 {:9.1f} us p99 {:9.1f} us  ratio {:5.2f}  "
                "p50/ref {:5.2f}  {:7.2f} Mops/s",
                row.transport, op_name, threads, format_bytes(block), n, row.gbps, row.p50_us,
                row.p99_us,
                !stream          ? "memcpy"
                : ref == ref_one ? "socket"
                                 : "polled",
                row.ref_gbps, row.ref_p50_us, row.ref_p99_us, row.ratio, row.p50_ratio, row.mops);
            if (n == 1) {
              line += fmt::format("  p99.9 {:.1f} us (ref {:.1f})", row.p999_us, row.ref_p999_us);
            }
            if (measure_cpu) {
              line += fmt::format("  cpu {:.2f} s/GB (socket {:.2f})  wakes/batch {:.1f} ({:.1f})",
                                  row.cpu_s_per_gb, row.ref_cpu_s_per_gb, row.switches_per_batch,
                                  row.ref_switches_per_batch);
            }
            if (row.polled_p50_us > 0) {
              line += fmt::format("  p50 blocking {:.1f} us, polled {:.1f} us", row.socket_p50_us,
                                  row.polled_p50_us);
            }
            if (row.iperf3_gbps > 0) {
              line += fmt::format(
                  "  iperf3 {:.2f} GB/s ratio {:.2f} cpu {:.2f} s/GB, -l 1M {:.2f} GB/s ratio "
                  "{:.2f} cpu {:.2f} s/GB",
                  row.iperf3_gbps, row.gbps / row.iperf3_gbps, row.iperf3_cpu_s_per_gb,
                  row.iperf3_1m_gbps, row.gbps / row.iperf3_1m_gbps, row.iperf3_1m_cpu_s_per_gb);
            }
            if (row.mooncake_gbps > 0) {
              line += fmt::format("  mooncake {:.2f} GB/s ratio {:.2f} mean {:.1f} us",
                                  row.mooncake_gbps, row.gbps / row.mooncake_gbps,
                                  row.mooncake_mean_us);
            }
            if (bare) {
              line += fmt::format("  bare call {:8.2f} GB/s p50 {:9.1f} us  ratio/bare {:5.2f}",
                                  row.bare_gbps, row.bare_p50_us, row.bare_ratio);
            }
            std::cout << line << "\n" << std::flush;
          }
        }
      }
    }
  }
  if (serve) (void)serve->process.ask("quit", std::chrono::seconds(5));
  return Status::Ok();
}

}  // namespace

void add_bench_engine_command(CLI::App& bench) {
  auto args = std::make_shared<EngineBenchArgs>();
  CLI::App* cmd = bench.add_subcommand("engine", "engine batch throughput vs memcpy / a socket");
  cmd->add_option("--transports", args->transports, "built here: " + benchable_names())
      ->delimiter(',');
  cmd->add_option("--op", args->op_names, "write, read")->delimiter(',');
  cmd->add_option("--threads", args->threads, "worker thread counts")
      ->delimiter(',')
      ->check(CLI::Range(1, 256));
  cmd->add_option("--block-bytes", args->block_bytes, "block sizes in bytes")
      ->delimiter(',')
      ->check(CLI::Range(uint64_t{1}, kMaxBenchBytes));
  cmd->add_option("--ops", args->ops_per_batch, "ops per batch")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--max-batch-bytes", args->max_batch_bytes,
                  "buffer size; larger cells are listed as skipped")
      ->check(CLI::Range(uint64_t{1}, kMaxBenchBytes));
  cmd->add_option("--min-time-ms", args->min_time_ms,
                  "measuring time per contestant and cell (engine, each reference)")
      ->check(CLI::Range(1, 3'600'000));
  cmd->add_option("--inline-bytes", args->inline_bytes, "engine inline_batch_bytes");
  cmd->add_option("--json", args->json_path, "write rows as JSON to this file ('-' = stdout)");
  cmd->add_option("--local-memory", args->local_memory,
                  "host, host-thp (huge pages advised on this process's buffers), device (tcp "
                  "WRITEs from / READs into cuda:0, CUDA builds)")
      ->delimiter(',');
  cmd->add_option("--peer-memory", args->peer_memory,
                  "the serve child's buffer: shared (allocate_shared; shm needs it), host "
                  "(registered anonymous memory, 4 KiB pages), host-thp (huge pages advised)")
      ->check(CLI::IsMember({"shared", "host", "host-thp"}));
  cmd->add_option("--rounds", args->rounds,
                  "interleaved rounds: each contestant runs min-time-ms / rounds per round")
      ->check(CLI::Range(1, 100000));
  cmd->add_option(
      "--iperf3", args->iperf3,
      "path of iperf3: tcp and ucx cells also race it in the same turns (single stream on "
      "loopback, default writes and -l 1M; figures from its own reports)");
  cmd->add_option("--iperf3-port", args->iperf3_port, "port of the iperf3 server (--iperf3)")
      ->check(CLI::Range(1u, 65535u));
  cmd->add_option("--mooncake", args->mooncake,
                  "path of Mooncake's transfer_engine_bench (built from Mooncake's source): tcp "
                  "cells also race it in the same turns (tcp transport, connection pool on, one "
                  "initiator run of 1 s per turn; figures from its own reports)");
  cmd->add_option("--mark-slow-us", args->mark_slow_us,
                  "write a line to the kernel's trace_marker for each engine op slower than "
                  "this, with its start (CLOCK_MONOTONIC), to read beside a scheduler trace "
                  "(root; 0: off)")
      ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--load", args->load,
                  "busy processes spinning beside the contestants (placed by the scheduler): "
                  "the contended case, measured like the quiet one")
      ->check(CLI::Range(0, 1024));
  cmd->callback([args] {
    std::vector<Row> rows;
    std::optional<CpuLoad> load;
    if (args->load > 0) {
      load.emplace(args->load);
      std::cout << "# load: " << load->size() << " busy process(es) beside the contestants\n";
    }
    Status s = run_grid(*args, rows);
    load.reset();
    if (!s.ok()) {
      std::cerr << "kvferry bench engine: " << s.to_string() << "\n";
      throw CLI::RuntimeError(1);
    }
    if (!args->json_path.empty()) {
      nlohmann::json out = nlohmann::json::array();
      for (const Row& r : rows) {
        out.push_back({{"transport", r.transport},
                       {"op", r.op},
                       {"block_bytes", r.block_bytes},
                       {"ops_per_batch", r.ops},
                       {"threads", r.threads},
                       {"gbps", r.gbps},
                       {"p50_us", r.p50_us},
                       {"p99_us", r.p99_us},
                       {"p999_us", r.p999_us},
                       {"ref_p999_us", r.ref_p999_us},
                       {"load", args->load},
                       {"ref_gbps", r.ref_gbps},
                       {"ref_p50_us", r.ref_p50_us},
                       {"ref_p99_us", r.ref_p99_us},
                       {"ratio", r.ratio},
                       {"p50_ratio", r.p50_ratio},
                       {"mops", r.mops},
                       {"cpu_s_per_gb", r.cpu_s_per_gb},
                       {"ref_cpu_s_per_gb", r.ref_cpu_s_per_gb},
                       {"switches_per_batch", r.switches_per_batch},
                       {"ref_switches_per_batch", r.ref_switches_per_batch},
                       {"socket_p50_us", r.socket_p50_us},
                       {"polled_p50_us", r.polled_p50_us},
                       {"local_memory", r.local_memory},
                       {"peer_memory", r.peer_memory},
                       {"bare_gbps", r.bare_gbps},
                       {"bare_p50_us", r.bare_p50_us},
                       {"bare_ratio", r.bare_ratio},
                       {"iperf3_gbps", r.iperf3_gbps},
                       {"iperf3_cpu_s_per_gb", r.iperf3_cpu_s_per_gb},
                       {"iperf3_1m_gbps", r.iperf3_1m_gbps},
                       {"mooncake_gbps", r.mooncake_gbps},
                       {"mooncake_mean_us", r.mooncake_mean_us},
                       {"iperf3_1m_cpu_s_per_gb", r.iperf3_1m_cpu_s_per_gb}});
      }
      write_json(args->json_path, out);
    }
  });
}

}  // namespace kvferry::cli
