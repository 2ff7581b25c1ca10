#include "kvferry/kv/send_strategy.h"

#include <gtest/gtest.h>

namespace kvferry::kv {
namespace {

// The table the seed's change was about: every transport, pinned. A new TransportKind fails
// to compile in send_strategy.cc's switch (-Werror=switch) and must be added here too.
TEST(DefaultSendStrategy, EveryTransportDefaultsToAllLayers) {
  EXPECT_EQ(default_send_strategy(TransportKind::kLocal), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kShm), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kTcp), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kCudaIpc), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kRdma), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kCma), SendStrategy::kAllLayers);
  EXPECT_EQ(default_send_strategy(TransportKind::kUcx), SendStrategy::kAllLayers);
  EXPECT_EQ(kAllTransportKinds.size(), 7u) << "a transport was added: pin its default above";
}

TEST(SendStrategyNames, RoundTripThroughParse) {
  for (SendStrategy s : kAllSendStrategies) {
    Result<SendStrategy> parsed = parse_send_strategy(send_strategy_name(s));
    ASSERT_TRUE(parsed.ok()) << send_strategy_name(s);
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(send_strategy_name(SendStrategy::kAllLayers), "all_layers");
  EXPECT_EQ(send_strategy_name(SendStrategy::kPerLayer), "per_layer");
  EXPECT_EQ(send_strategy_name(SendStrategy::kIndexSharded), "index_sharded");
}

TEST(SendStrategyNames, UnknownNameIsInvalidArgumentNamingItAndTheValidOnes) {
  for (const char* bad : {"INTRA_NODE_NVLINK", "all-layers", "", "All_Layers"}) {
    Result<SendStrategy> parsed = parse_send_strategy(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    // Built by appending: gcc 12 at -O3 reports a false -Wrestrict inside libstdc++ for
    // `"'" + std::string(bad)` (GCC bug 105329).
    std::string quoted = "'";
    quoted.append(bad).append("'");
    EXPECT_NE(parsed.status().message().find(quoted), std::string::npos);
    EXPECT_NE(parsed.status().message().find("all_layers, per_layer, index_sharded"),
              std::string::npos);
  }
}

}  // namespace
}  // namespace kvferry::kv
