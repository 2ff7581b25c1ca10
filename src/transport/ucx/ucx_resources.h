// What UCX offers on this host, read once when the ucx transport starts: its transports
// ("tcp", "rc_mlx5", ...), whether one of them is hardware RMA (whose NIC checks rkey
// bounds), and whether it registers CUDA memory. Pure parsing here, so the decisions are
// unit-tested without RDMA hardware; ucx_worker.cc feeds it ucp_context_print_info's text.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvferry::detail {

struct UcxResources {
  std::vector<std::string> transports;  // one per UCX resource: "tcp/lo", "rc_mlx5/mlx5_0:1"
  bool hardware_rma = false;            // one of them is rc, dc, ud or another verbs transport
  bool cuda_memory = false;             // UCP reports UCS_MEMORY_TYPE_CUDA support
};

// The "# resource N : md M dev D flags -- TL/DEV" lines of ucp_context_print_info.
std::vector<std::string> parse_ucx_resource_lines(std::string_view printed);

// Whether a UCX transport name ("rc_mlx5/mlx5_0:1" or "rc_verbs") moves put/get in RDMA
// hardware: rc, dc, ud (verbs or mlx5), or any other *_verbs / *_mlx5 transport. tcp, self,
// sysv, posix, cma, knem, xpmem emulate or copy in software and do not check rkey bounds.
bool is_hardware_rma_transport(std::string_view transport);

// The transports joined by ", " (for messages).
std::string join_transports(const std::vector<std::string>& transports);

}  // namespace kvferry::detail
