// The checks of `kvferry doctor`: what this machine offers the transports, each by probe or
// by reading the kernel's limits, with a verdict and the reason, and the routes an engine
// here would take to a peer.
//
// A check never throws and never aborts: a probe that cannot run reports kFail with why.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvferry::cli {

enum class Verdict {
  kOk,    // works, and a route relies on it
  kInfo,  // not a problem: absent here, or not used by a transport of this build
  kWarn,  // works, but a limit is low enough to hurt (says which)
  kFail,  // broken: a route that should be taken is out
};

const char* verdict_name(Verdict v);

struct Check {
  std::string name;  // "shm", "cross_memory_attach", "cuda", ...
  Verdict verdict = Verdict::kInfo;
  std::string value;   // what was found, short
  std::string detail;  // why that verdict, and what it means for the routes
};

// shm: a child process connects to this process's abstract Unix socket, receives its memfd
// over it (SCM_RIGHTS), maps it and reads and writes it — what a same-host peer does to reach
// allocate_shared memory over the shm transport (transport/shm_fd_server.h).
Check check_shm();
// process_vm_readv from a child into this process (the cma transport's copy; what container
// runtimes and yama ptrace_scope deny).
Check check_cross_memory_attach();
// CUDA devices and their peer-access matrix (builds with CUDA); cuda_ipc's verdict.
Check check_cuda();
// UCX / verbs: not built in kvferry yet (no rdma transport).
Check check_ucx();
Check check_memlock();
Check check_huge_pages();
Check check_tcp_buffers();

std::vector<Check> machine_checks();

// The routes an engine here would take to `peer` ("host:port"), per (local, remote) memory
// kind: the transport chosen and why, and for each other transport why it is out. A check
// named "peer" (kFail when unreachable or when no route reaches the peer's host memory),
// plus the routes as JSON: [{"local", "remote", "transport" (or null), "reason",
// "others": [{"transport", "out"}]}].
struct PeerReport {
  Check check;
  nlohmann::json routes = nlohmann::json::array();
};
PeerReport check_peer(const std::string& peer);

}  // namespace kvferry::cli
