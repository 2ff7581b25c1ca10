#include "doctor_checks.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/fd.h"
#include "core/net.h"
#include "kvferry/transfer_engine.h"
#include "transport/built_transports.h"
#include "transport/shm_mapping.h"

#ifdef KVFERRY_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvferry::cli {
namespace {

constexpr auto kProbeTimeout = std::chrono::seconds(5);
constexpr uint64_t kLowTcpBufferBytes = 4u << 20;  // below this a fast link cannot fill
constexpr uint64_t kLowMemlockBytes = 64u << 20;
constexpr unsigned char kBefore = 0x5a;
constexpr unsigned char kAfter = 0xa5;

// Exit codes of the probe children: 0 ok, else 100 + errno-class.
constexpr int kChildOpenFailed = 101;
constexpr int kChildMapFailed = 102;
constexpr int kChildWrongBytes = 103;
constexpr int kChildReadFailed = 104;
constexpr int kChildConnectFailed = 105;
constexpr int kChildReceiveFailed = 106;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  std::replace(text.begin(), text.end(), '\t', ' ');  // /proc/sys triples are tab-separated
  return text;
}

std::string bytes_text(uint64_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1ull << 20)) return fmt::format("{:.1f} MiB", double(b) / (1 << 20));
  if (b >= (1ull << 10)) return fmt::format("{:.0f} KiB", double(b) / (1 << 10));
  return fmt::format("{} B", b);
}

// Waits for the child up to the probe timeout (then kills it); its exit code, or -1.
int reap(pid_t child) {
  const auto until = std::chrono::steady_clock::now() + kProbeTimeout;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    pid_t r = ::waitpid(child, &status, WNOHANG);
    if (r == child) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, &status, 0);
  return -1;
}

std::string ptrace_scope_note() {
  const std::string scope = read_text("/proc/sys/kernel/yama/ptrace_scope");
  return scope.empty() ? "no yama LSM" : "yama ptrace_scope " + scope;
}

}  // namespace

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kInfo: return "info";
    case Verdict::kWarn: return "warn";
    case Verdict::kFail: return "FAIL";
  }
  return "?";
}

Check check_shm() {
  Check c{"shm", Verdict::kFail, "", ""};
  Result<std::unique_ptr<ShmAllocation>> shm = ShmAllocation::create("doctor", 4096);
  if (!shm.ok()) {
    c.value = "no memfd";
    c.detail = "allocate_shared fails here (" + shm.status().to_string() +
               "): no shared memory, so same-host peers fall back to tcp";
    return c;
  }
  (*shm)->addr()[0] = static_cast<char>(kBefore);
  // What the shm transport needs (transport/shm_fd_server.h): a peer connects to this
  // process's abstract Unix socket, receives the memfd over it (SCM_RIGHTS) and maps it.
  const std::string name = fmt::format("kvferry-doctor/{}", ::getpid());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  const auto address_length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener.valid() ||
      ::bind(listener.get(), reinterpret_cast<const sockaddr*>(&address), address_length) != 0 ||
      ::listen(listener.get(), 1) != 0) {
    c.value = "no socket";
    c.detail = fmt::format(
        "an abstract Unix socket cannot be opened here ({}): the shm transport hands its memfds "
        "over one, so same-host peers use the next route (cma, tcp)",
        std::strerror(errno));
    return c;
  }
  // The child only makes system calls (no allocation): safe after fork.
  const pid_t child = ::fork();
  if (child == 0) {
    int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0 ||
        ::connect(sock, reinterpret_cast<const sockaddr*>(&address), address_length) != 0) {
      ::_exit(kChildConnectFailed);
    }
    char byte = 0;
    FdMessage m(&byte, 1);
    if (::recvmsg(sock, &m.msg, MSG_CMSG_CLOEXEC) != 1) ::_exit(kChildReceiveFailed);
    const int fd = m.attached();
    if (fd < 0) ::_exit(kChildReceiveFailed);
    void* p = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) ::_exit(kChildMapFailed);
    auto* bytes = static_cast<unsigned char*>(p);
    if (bytes[0] != kBefore) ::_exit(kChildWrongBytes);
    bytes[0] = kAfter;
    ::_exit(0);
  }
  if (child < 0) {
    c.value = "probe failed";
    c.detail = std::string("fork: ") + std::strerror(errno);
    return c;
  }
  std::string send_error;
  pollfd ready{listener.get(), POLLIN, 0};
  const int waited = ::poll(&ready, 1, static_cast<int>(kProbeTimeout.count() * 1000));
  Fd connection(waited == 1 ? ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC) : -1);
  if (connection.valid()) {
    const std::byte byte{1};
    Status sent =
        send_with_fd(connection.get(), {&byte, 1}, (*shm)->fd(), Clock::now() + kProbeTimeout);
    if (!sent.ok()) send_error = "sending it failed: " + sent.message();
  }
  const int code = reap(child);
  const bool landed = static_cast<unsigned char>((*shm)->addr()[0]) == kAfter;
  if (code == 0 && landed) {
    c.verdict = Verdict::kOk;
    c.value = "usable";
    c.detail =
        "a child process received this process's memfd over an abstract Unix socket "
        "(SCM_RIGHTS), mapped it and wrote it: same-host peers reach allocate_shared memory "
        "over shm";
    return c;
  }
  c.value = "denied";
  const std::string why = !send_error.empty()           ? send_error
                          : code == kChildConnectFailed ? "connecting to the socket failed"
                          : code == kChildReceiveFailed ? "receiving the descriptor failed"
                          : code == kChildMapFailed     ? "mapping it failed"
                                                        : "the bytes did not arrive";
  c.detail = fmt::format(
      "a child could not receive and map this process's memfd over abstract Unix socket @{} "
      "({}): shm routes are out, same-host peers use the next route (check the container's "
      "seccomp profile or LSM policy on SCM_RIGHTS and memfd mappings)",
      name, why);
  return c;
}

Check check_cross_memory_attach() {
  Check c{"cross_memory_attach", Verdict::kInfo, "", ""};
  static volatile unsigned char target = kBefore;
  int ready[2];
  if (::pipe(ready) != 0) {
    c.value = "probe failed";
    c.detail = std::string("pipe: ") + std::strerror(errno);
    return c;
  }
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[1]);
    char go = 0;
    if (::read(ready[0], &go, 1) != 1) ::_exit(kChildReadFailed);
    unsigned char seen = 0;
    iovec local{&seen, 1};
    iovec remote{const_cast<unsigned char*>(&target), 1};
    if (::process_vm_readv(parent, &local, 1, &remote, 1, 0) != 1) ::_exit(kChildOpenFailed);
    ::_exit(seen == kAfter ? 0 : kChildWrongBytes);
  }
  ::close(ready[0]);
  if (child < 0) {
    ::close(ready[1]);
    c.value = "probe failed";
    c.detail = std::string("fork: ") + std::strerror(errno);
    return c;
  }
  target = kAfter;  // after the fork: only a real cross-process read sees it
  const char go = 1;
  const bool sent = ::write(ready[1], &go, 1) == 1;
  ::close(ready[1]);
  const int code = reap(child);
  c.value = sent && code == 0 ? "permitted" : "denied";
  c.detail =
      fmt::format("process_vm_readv from another process into this one is {} ({}): {}", c.value,
                  ptrace_scope_note(),
                  c.value == "permitted"
                      ? "same-host peers' host memory (not allocate_shared) goes over cma"
                      : "same-host peers' host memory (not allocate_shared) falls back to tcp");
  return c;
}

Check check_cuda() {
  Check c{"cuda", Verdict::kInfo, "", ""};
#ifdef KVFERRY_WITH_CUDA
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    c.value = "no device";
    c.detail = fmt::format(
        "built with the CUDA runtime {}.{}; cudaGetDeviceCount: {}: no CUDA device, so "
        "cuda_ipc and tcp's device staging are out and device memory cannot be registered",
        runtime / 1000, (runtime % 1000) / 10,
        e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return c;
  }
  std::string names;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, i);
    names += fmt::format("{}{}: {}", i == 0 ? "" : ", ", i, prop.name);
  }
  std::string matrix;
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < count; ++j) {
      int can = i == j ? 1 : 0;
      if (i != j) cudaDeviceCanAccessPeer(&can, i, j);
      matrix += can ? '1' : '0';
    }
    if (i + 1 < count) matrix += ' ';
  }
  c.verdict = Verdict::kOk;
  c.value = fmt::format("{} device(s)", count);
  c.detail = fmt::format(
      "{}; peer access (row can access column) {}; cuda_ipc carries device memory between "
      "same-host engines, tcp carries it to other hosts (staged through pinned host buffers)",
      names, matrix);
#else
  c.value = "not built";
  c.detail =
      "this build has no cuda_ipc transport (configure with the CUDA toolkit): device "
      "memory cannot be registered";
#endif
  return c;
}

Check check_ucx() {
  const std::vector<BuiltTransport> built = built_transports();
  const bool has_ucx = std::any_of(built.begin(), built.end(), [](const BuiltTransport& t) {
    return t.kind == TransportKind::kUcx;
  });
  if (!has_ucx) {
    return Check{"ucx", Verdict::kInfo, "not built",
                 "this build has no ucx transport (UCX/verbs): peers on other hosts use tcp"};
  }
  return Check{"ucx", Verdict::kInfo, "built",
               "ucx is preferred over tcp only where UCX reports hardware RMA (rc/dc/ud/verbs) "
               "on both sides; emulated paths need KVFERRY_UCX_ALLOW_EMULATED=1 (the route lines "
               "say which applies; `ucx_info -d` lists this host's UCX transports)"};
}

Check check_memlock() {
  Check c{"memlock", Verdict::kInfo, "", ""};
  rlimit limit{};
  if (::getrlimit(RLIMIT_MEMLOCK, &limit) != 0) {
    c.value = "unknown";
    c.detail = std::string("getrlimit: ") + std::strerror(errno);
    return c;
  }
  c.value = limit.rlim_cur == RLIM_INFINITY ? "unlimited" : bytes_text(limit.rlim_cur);
  c.detail = limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < kLowMemlockBytes
                 ? "low for RDMA registration (which pins memory against it; not built here): "
                   "raise it (ulimit -l, LimitMEMLOCK=) before adding an rdma transport"
                 : "enough to pin registered memory";
  return c;
}

Check check_huge_pages() {
  Check c{"huge_pages", Verdict::kInfo, "", ""};
  std::istringstream meminfo(read_text("/proc/meminfo"));
  std::string line, total = "?", size = "?";
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key, value;
    fields >> key >> value;
    if (key == "HugePages_Total:") total = value;
    if (key == "Hugepagesize:") size = value + " kB";
  }
  const std::string thp = read_text("/sys/kernel/mm/transparent_hugepage/enabled");
  c.value = fmt::format("{} reserved x {}", total, size);
  c.detail = fmt::format(
      "transparent huge pages: {}; kvferry does not require huge pages "
      "(fewer TLB misses on large copies when present)",
      thp.empty() ? "unknown" : thp);
  return c;
}

Check check_tcp_buffers() {
  Check c{"tcp_buffers", Verdict::kOk, "", ""};
  auto max_of = [](const std::string& triple) -> uint64_t {
    std::istringstream s(triple);
    uint64_t lo = 0, def = 0, hi = 0;
    s >> lo >> def >> hi;
    return hi;
  };
  const std::string rmem = read_text("/proc/sys/net/ipv4/tcp_rmem");
  const std::string wmem = read_text("/proc/sys/net/ipv4/tcp_wmem");
  const std::string core_r = read_text("/proc/sys/net/core/rmem_max");
  const std::string core_w = read_text("/proc/sys/net/core/wmem_max");
  if (rmem.empty() || wmem.empty()) {
    c.verdict = Verdict::kInfo;
    c.value = "unknown";
    c.detail = "cannot read /proc/sys/net/ipv4/tcp_[rw]mem (another network namespace?)";
    return c;
  }
  const uint64_t rmax = max_of(rmem), wmax = max_of(wmem);
  c.value = fmt::format("autotune max rcv {} snd {}", bytes_text(rmax), bytes_text(wmax));
  c.detail = fmt::format("tcp_rmem {}; tcp_wmem {}; core rmem_max {} wmem_max {}", rmem, wmem,
                         core_r, core_w);
  if (rmax < kLowTcpBufferBytes || wmax < kLowTcpBufferBytes) {
    c.verdict = Verdict::kWarn;
    c.detail += fmt::format(
        ": below {}, a tcp lane cannot keep a fast link with a millisecond of round trip busy "
        "(raise net.ipv4.tcp_rmem/tcp_wmem)",
        bytes_text(kLowTcpBufferBytes));
  }
  return c;
}

std::vector<Check> machine_checks() {
  return {check_shm(),     check_cross_memory_attach(), check_cuda(),       check_ucx(),
          check_memlock(), check_huge_pages(),          check_tcp_buffers()};
}

PeerReport check_peer(const std::string& peer_name) {
  PeerReport report;
  report.check = Check{"peer", Verdict::kFail, peer_name, ""};
  EngineOptions options;
  options.name = "doctor";
  Result<std::unique_ptr<TransferEngine>> engine = TransferEngine::create(options);
  if (!engine.ok()) {
    report.check.detail = "cannot start an engine here: " + engine.status().to_string();
    return report;
  }
  Result<PeerHandle> peer = (*engine)->open_peer(peer_name);
  if (!peer.ok()) {
    report.check.detail = "cannot open the peer: " + peer.status().to_string();
    return report;
  }
  const std::vector<Route> routes = peer->routes();
  // Each transport forced in turn, on an engine of its own (peers are cached by name): why
  // it could not carry a route, or that it could but another comes first.
  std::vector<std::pair<TransportKind, std::vector<Route>>> forced;
  std::vector<std::pair<TransportKind, std::string>> refused;
  for (TransportKind kind : kAllTransportKinds) {
    EngineOptions o = options;
    o.forced_transport = kind;
    Result<std::unique_ptr<TransferEngine>> e = TransferEngine::create(o);
    if (!e.ok()) {
      refused.emplace_back(kind, e.status().message());
      continue;
    }
    Result<PeerHandle> p = (*e)->open_peer(peer_name);
    if (!p.ok()) {
      refused.emplace_back(kind, "refused by open_peer: " + p.status().message());
      continue;
    }
    forced.emplace_back(kind, p->routes());
  }
  bool host_route = false;
  for (const Route& r : routes) {
    nlohmann::json others = nlohmann::json::array();
    for (TransportKind kind : kAllTransportKinds) {
      if (r.transport == kind) continue;
      std::string out;
      for (const auto& [k, why] : refused) {
        if (k == kind) out = why;
      }
      for (const auto& [k, forced_routes] : forced) {
        if (k != kind) continue;
        for (const Route& fr : forced_routes) {
          if (fr.local != r.local || fr.remote != r.remote) continue;
          out = fr.transport ? fmt::format("could carry it, but {} comes first",
                                           r.transport ? transport_kind_name(*r.transport)
                                                       : std::string_view("none"))
                             : fr.reason;
        }
      }
      others.push_back({{"transport", transport_kind_name(kind)}, {"out", out}});
    }
    report.routes.push_back(
        {{"local", memory_kind_name(r.local)},
         {"remote", memory_kind_name(r.remote)},
         {"transport", r.transport ? nlohmann::json(transport_kind_name(*r.transport))
                                   : nlohmann::json(nullptr)},
         {"reason", r.reason},
         {"others", std::move(others)}});
    if (r.transport && r.local == MemoryKind::kHost && r.remote == MemoryKind::kHost) {
      host_route = true;
    }
  }
  report.check.verdict = host_route ? Verdict::kOk : Verdict::kFail;
  report.check.value = fmt::format("{} (incarnation {:x})", peer_name, peer->incarnation());
  report.check.detail = host_route ? "reachable; preferred route " +
                                         std::string(transport_kind_name(peer->transport()))
                                   : "reachable, but no transport reaches its host memory";
  return report;
}

}  // namespace kvferry::cli
