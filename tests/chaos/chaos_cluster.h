// The chaos test's cluster: two prefill and two decode processes (`kvferry pd-prefill`,
// `pd-decode`), each in its own network namespace, joined by veth pairs to a bridge in a hub
// namespace where the etcd server and the two prefill instances' bootstrap servers run. The
// workers speak tcp and find each other through etcd. Each link is impaired (tc netem where
// the kernel has it; else random loss with nftables and an htb rate limit, which queues
// under load). The faults: kill -9 and restart a worker, SIGSTOP/SIGCONT one, kill -9 and
// restart etcd (its data wiped: every record must be published again), drop a worker's
// link with nftables.
//
// Every line a worker prints arrives on one queue (next_event), read by a thread per
// process. Thread-safety: one driving thread; the queue is the only thing the readers share.
#pragma once

#include <fmt/format.h>
#include <signal.h>
#include <stdio.h>

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "integration/netns_support.h"
#include "integration/pd_fault_support.h"
#include "metadata/metadata_store.h"

namespace kvferry::testing {

inline constexpr int kWorkers = 4;  // prefill 0, prefill 1, decode 0, decode 1
inline constexpr uint32_t kPageTokens = 16;
inline constexpr uint32_t kChunkTokens = 128;
inline constexpr uint32_t kPoolPages = 2048;
inline constexpr uint64_t kBytesPerToken = 1024;  // tiny-mha
inline constexpr int kHeartbeatMs = 500;
inline constexpr int kBootstrapTimeoutMs = 5000;
inline constexpr int kWaitingTimeoutMs = 10000;
inline constexpr int kWatchReleasedMs = 50;  // decode watches a failed request's pages
inline constexpr int kEtcdPort = 2379;       // inside the hub namespace: nothing else there
inline constexpr char kHubIp[] = "10.77.0.1";

enum class Role : uint8_t { kPrefill, kDecode };

struct WorkerEvent {
  int slot = 0;
  int generation = 0;
  bool closed = false;  // the process closed its stdout (exited or was killed)
  std::string line;
};

// /proc figures of one process.
struct Footprint {
  uint64_t fds = 0, threads = 0, rss_kib = 0;
};

inline Footprint footprint_of(pid_t pid) {
  Footprint f;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++f.fds;
  }
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string key;
  while (status >> key) {
    if (key == "Threads:") status >> f.threads;
    if (key == "VmRSS:") status >> f.rss_kib;
  }
  return f;
}

class ChaosCluster {
 public:
  struct Worker {
    Role role = Role::kPrefill;
    int index = 0;
    NetNamespace ns;
    std::string ip;
    std::optional<PdProcess> process;
    int generation = 0;
    bool up = false;
    std::string endpoint;  // the engine's peer name (decode restarts keep it)
    std::thread reader;
    std::atomic<bool> stop_reading{false};
  };

  explicit ChaosCluster(bool integrity) : integrity_(integrity) {}
  ~ChaosCluster() {
    for (auto& w : workers_) stop_worker(w);
    for (auto& b : bootstraps_) b.reset();
    if (etcd_) etcd_->kill_now();
  }

  // Builds the namespaces and starts everything; on failure returns why (the test skips
  // when the machine cannot do namespaces at all, and fails otherwise).
  std::string start() {
    const int pid = ::getpid();
    prefix_ = fmt::format("kvc{}", pid % 100000);
    if (!hub_.create(prefix_ + "h") ||
        hub_.run("ip link add br0 type bridge && ip addr add " + std::string(kHubIp) +
                 "/24 dev br0 && ip link set br0 up") != 0) {
      return "cannot create the hub namespace and its bridge";
    }
    for (int slot = 0; slot < kWorkers; ++slot) {
      Worker& w = workers_[slot];
      w.role = slot < 2 ? Role::kPrefill : Role::kDecode;
      w.index = slot % 2;
      w.ip = fmt::format("10.77.0.{}", 10 + slot);
      const std::string name =
          fmt::format("{}{}{}", prefix_, w.role == Role::kPrefill ? 'p' : 'd', w.index);
      if (!w.ns.create(name) ||
          !add_veth_pair({w.ns.name(), name + "w", w.ip + "/24"}, {hub_.name(), name + "h", ""}) ||
          hub_.run(fmt::format("ip link set {}h master br0", name)) != 0) {
        return "cannot join namespace " + name + " to the hub";
      }
      impairment_ = impair(w);
    }
    if (std::string why = start_etcd(); !why.empty()) return why;
    for (int i = 0; i < 2; ++i) {
      bootstraps_[i].emplace(spawn_pd(
          {"bootstrap", "--listen", std::string(kHubIp) + ":0", "--rank-stale-after-ms", "1500"},
          logs_.file(fmt::format("bootstrap{}", i)), hub_.exec_prefix()));
      bootstrap_addr_[i] = bootstraps_[i]->hello.value("address", "");
      if (bootstrap_addr_[i].empty()) return "bootstrap server did not start";
    }
    for (auto& w : workers_) {
      if (!spawn_worker(w)) return "worker did not start: " + log_of(w);
    }
    return "";
  }

  const std::string& impairment() const { return impairment_; }
  // Copies every process's log to `dir` (kept after a failed run).
  void keep_logs(const std::string& dir) const {
    std::error_code ignored;
    std::filesystem::copy(logs_.path(), dir, std::filesystem::copy_options::recursive, ignored);
  }
  Worker& worker(int slot) { return workers_[slot]; }
  const std::string& bootstrap_address(int prefill_index) const {
    return bootstrap_addr_[prefill_index];
  }
  std::string log_of(const Worker& w) const { return w.process ? w.process->log() : ""; }

  // The next line any worker printed, or nullopt after `wait`.
  std::optional<WorkerEvent> next_event(std::chrono::milliseconds wait) {
    std::unique_lock lock(events_mu_);
    if (!events_cv_.wait_for(lock, wait, [&] { return !events_.empty(); })) return std::nullopt;
    WorkerEvent e = std::move(events_.front());
    events_.pop_front();
    return e;
  }

  bool send(Worker& w, const std::string& line) {
    return w.up && w.process && w.process->process.send_line(line).ok();
  }

  // kill -9 (reaped before it returns), then a new process in its place.
  bool kill_and_restart(Worker& w) {
    stop_worker(w);
    return spawn_worker(w);
  }
  void signal(Worker& w, int sig) {
    if (w.process) ::kill(w.process->process.pid(), sig);
  }
  // Drops every packet in and out of the worker's namespace (nftables), or lets them pass.
  bool drop_link(Worker& w, bool drop) {
    if (!drop) return w.ns.run("nft delete table inet kvchaos_drop") == 0;
    return w.ns.run(
               "nft add table inet kvchaos_drop && "
               "nft add chain inet kvchaos_drop in \"{ type filter hook input priority -10; policy "
               "drop; }\" && "
               "nft add chain inet kvchaos_drop out \"{ type filter hook output priority -10; "
               "policy drop; }\"") == 0;
  }

  // kill -9 etcd and wipe its data: when it comes back it knows nothing.
  void kill_etcd() {
    if (etcd_) etcd_->kill_now();
    etcd_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(etcd_dir(), ignored);
  }
  // Starts etcd and waits until it answers; returns why not, or empty.
  std::string start_etcd() {
    std::filesystem::create_directories(etcd_dir());
    const std::string url = fmt::format("http://{}:{}", kHubIp, kEtcdPort);
    const std::string peer = fmt::format("http://{}:{}", kHubIp, kEtcdPort + 1);
    std::vector<std::string> argv = {"/bin/sh", "-c", "log=$1; shift; exec \"$@\" >>\"$log\" 2>&1",
                                     "sh", logs_.file("etcd")};
    for (const std::string& a : hub_.exec_prefix()) argv.push_back(a);
    for (const std::string& a :
         {std::string("etcd"), std::string("--name"), std::string("chaos"),
          std::string("--data-dir"), etcd_dir(), std::string("--listen-client-urls"), url,
          std::string("--advertise-client-urls"), url, std::string("--listen-peer-urls"), peer,
          std::string("--initial-advertise-peer-urls"), peer, std::string("--initial-cluster"),
          "chaos=" + peer}) {
      argv.push_back(a);
    }
    Result<ChildProcess> etcd = ChildProcess::spawn(argv);
    if (!etcd.ok()) return "etcd: " + etcd.status().to_string();
    etcd_.emplace(std::move(*etcd));
    for (int i = 0; i < 100; ++i) {
      if (hub_.run("curl -sf " + url + "/health") == 0) return "";
      std::this_thread::sleep_for(100ms);
    }
    return "etcd did not come up in the hub namespace";
  }
  std::string etcd_uri() const { return fmt::format("etcd://{}:{}", kHubIp, kEtcdPort); }
  // The keys etcd holds now (etcdctl inside the hub namespace).
  std::set<std::string> etcd_keys() const {
    std::set<std::string> keys;
    const std::string command = fmt::format(
        "{} netns exec {} etcdctl --endpoints=http://{}:{} --command-timeout=2s get "
        "--prefix --keys-only kvferry/ 2>/dev/null",
        kIp, hub_.name(), kHubIp, kEtcdPort);
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return keys;
    char buffer[512];
    while (::fgets(buffer, sizeof buffer, pipe) != nullptr) {
      std::string key(buffer);
      while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
      if (!key.empty()) keys.insert(key);
    }
    ::pclose(pipe);
    return keys;
  }
  // Whether every live worker's engine record is in etcd.
  bool all_registered() const {
    std::set<std::string> keys = etcd_keys();
    for (const Worker& w : workers_) {
      if (w.up && keys.count(metadata_key(w.endpoint)) == 0) return false;
    }
    return true;
  }

 private:
  std::string etcd_dir() const { return logs_.file("etcd-data"); }

  // netem where the kernel has it; else nftables random loss + an htb rate limit.
  std::string impair(Worker& w) {
    const std::string dev = w.ns.name() + "w";
    if (w.ns.run(fmt::format(
            "tc qdisc add dev {} root netem delay 1ms 1ms loss 0.2% reorder 2% 50%", dev)) == 0) {
      return "tc netem: delay 1 ms, jitter 1 ms, loss 0.2 %, reordering 2 %";
    }
    const bool loss =
        w.ns.run(
            "nft add table inet kvchaos_loss && "
            "nft add chain inet kvchaos_loss out \"{ type filter hook output priority 0; }\" && "
            "nft add rule inet kvchaos_loss out meta l4proto tcp numgen random mod 1000 \"<\" 2 "
            "drop") == 0;
    const bool rate = w.ns.run(fmt::format(
                          "tc qdisc add dev {0} root handle 1: htb default 1 && "
                          "tc class add dev {0} parent 1: classid 1:1 htb rate 400mbit burst 64k",
                          dev)) == 0;
    return fmt::format(
        "no sch_netem in this kernel: {}{}",
        loss ? "nftables random loss 0.2 % of tcp packets" : "no loss",
        rate ? ", htb rate 400 Mbit/s (queueing delay and jitter under load); no reordering" : "");
  }

  bool spawn_worker(Worker& w) {
    std::vector<std::string> args = {
        w.role == Role::kPrefill ? "pd-prefill" : "pd-decode", "--model", "tiny-mha",
        "--page-tokens", std::to_string(kPageTokens), "--pool-pages", std::to_string(kPoolPages),
        "--transport", "tcp", "--heartbeat-ms", std::to_string(kHeartbeatMs),
        "--bootstrap-timeout-ms", std::to_string(kBootstrapTimeoutMs), "--waiting-timeout-ms",
        std::to_string(kWaitingTimeoutMs), "--metadata", etcd_uri(), "--metadata-ttl-s", "3",
        // A decode comes back on its old endpoint (stale peer caches must notice the new
        // incarnation); a prefill on a new one.
        "--listen", w.role == Role::kDecode && !w.endpoint.empty() ? w.endpoint : w.ip + ":0"};
    if (integrity_) args.emplace_back("--integrity");
    if (w.role == Role::kPrefill) {
      args.insert(args.end(), {"--bootstrap", bootstrap_addr_[w.index], "--chunk-tokens",
                               std::to_string(kChunkTokens)});
    } else {
      args.insert(args.end(), {"--watch-released-ms", std::to_string(kWatchReleasedMs)});
    }
    ++w.generation;
    w.process.emplace(spawn_pd(args, logs_.file(fmt::format("{}-{}", w.ns.name(), w.generation)),
                               w.ns.exec_prefix()));
    const std::string endpoint = w.process->hello.value("endpoint", "");
    if (endpoint.empty()) {
      w.process.reset();
      return false;
    }
    w.endpoint = endpoint;
    w.up = true;
    w.stop_reading = false;
    const int slot = static_cast<int>(&w - workers_.data());
    w.reader = std::thread([this, &w, slot, generation = w.generation] {
      while (!w.stop_reading) {
        Result<std::string> line = w.process->process.read_line(200ms);
        if (!line.ok() && line.status().code() == StatusCode::kTimeout) continue;
        std::lock_guard lock(events_mu_);
        events_.push_back({slot, generation, !line.ok(), line.ok() ? *line : ""});
        events_cv_.notify_one();
        if (!line.ok()) return;
      }
    });
    return true;
  }

  void stop_worker(Worker& w) {
    w.up = false;
    if (w.process) {
      ::kill(w.process->process.pid(), SIGCONT);  // a stopped process cannot die of SIGKILL late
      w.process->process.kill_now();
    }
    w.stop_reading = true;
    if (w.reader.joinable()) w.reader.join();
    w.process.reset();
  }

  bool integrity_;
  LogDir logs_;
  std::string prefix_;
  NetNamespace hub_;
  std::array<Worker, kWorkers> workers_;
  std::string impairment_;
  std::optional<ChildProcess> etcd_;
  std::array<std::optional<PdProcess>, 2> bootstraps_;
  std::array<std::string, 2> bootstrap_addr_;
  std::mutex events_mu_;
  std::condition_variable events_cv_;
  std::deque<WorkerEvent> events_;
};

}  // namespace kvferry::testing
