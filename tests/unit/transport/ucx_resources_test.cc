// What the ucx transport reads from UCX's resource list: which transports are hardware
// RMA (whose NIC checks rkey bounds) and which emulate put/get in software. The RDMA rows
// cannot run on these machines; their parsing and classification are pinned here.
#include "transport/ucx/ucx_resources.h"

#include <gtest/gtest.h>

namespace kvferry::detail {
namespace {

TEST(UcxResources, ParsesTheResourceLinesOfUcpContextPrintInfo) {
  const char* printed =
      "#\n# UCP context\n#\n#     component 1  :  tcp\n#            md 1  :  component 1  tcp \n"
      "#      resource 0  :  md 0  dev 0  flags -- self/memory0\n"
      "#      resource 1  :  md 1  dev 1  flags -- tcp/lo\n"
      "#      resource 2  :  md 2  dev 2  flags -- rc_mlx5/mlx5_0:1\n"
      "#      resource 3  :  md 2  dev 2  flags -- dc_mlx5/mlx5_0:1\n#\n";
  EXPECT_EQ(
      parse_ucx_resource_lines(printed),
      (std::vector<std::string>{"self/memory0", "tcp/lo", "rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_0:1"}));
  EXPECT_TRUE(parse_ucx_resource_lines("").empty());
  EXPECT_TRUE(parse_ucx_resource_lines("resource 0 : md 0 flags -- tcp/lo\n").empty())
      << "only the '#'-prefixed lines of print_info are read";
}

TEST(UcxResources, VerbsTransportsAreHardwareRmaAndSoftwareOnesAreNot) {
  for (const char* hw : {"rc_verbs/mlx5_0:1", "rc_mlx5/mlx5_0:1", "dc_mlx5/mlx5_1:1",
                         "ud_verbs/mlx5_0:1", "ud_mlx5", "rc", "ib_verbs/x"}) {
    EXPECT_TRUE(is_hardware_rma_transport(hw)) << hw;
  }
  for (const char* sw : {"tcp/lo", "tcp/eth0", "self/memory0", "sysv/memory", "posix/memory",
                         "cma/memory", "knem/memory", "xpmem/memory", "rcx", "udp/eth0"}) {
    EXPECT_FALSE(is_hardware_rma_transport(sw)) << sw;
  }
}

TEST(UcxResources, JoinsTransportsForMessages) {
  EXPECT_EQ(join_transports({"tcp/lo", "tcp/eth0"}), "tcp/lo, tcp/eth0");
  EXPECT_EQ(join_transports({}), "none");
}

}  // namespace
}  // namespace kvferry::detail
