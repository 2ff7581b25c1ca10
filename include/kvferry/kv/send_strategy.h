// SendStrategy: how a request's blocks are split into engine calls.
//
// The choice that started kvferry (SEED.md): one call over every layer beats one call per
// layer whenever per-call cost matters, and the choice must come from a typed transport
// kind, never from a string compare. Names exist only at the edges (CLI, config) and are
// parsed once here.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "kvferry/status.h"
#include "kvferry/transport_kind.h"

namespace kvferry::kv {

enum class SendStrategy : uint8_t {
  kAllLayers = 0,  // one call with every entry's blocks, entries in order
  kPerLayer,       // one call per entry, all submitted at once and run concurrently
  kIndexSharded,   // one call per slice of max_pages_per_call pages over all entries,
                   // run one after the other, stopping at the first failure
};

inline constexpr std::array<SendStrategy, 3> kAllSendStrategies = {
    SendStrategy::kAllLayers, SendStrategy::kPerLayer, SendStrategy::kIndexSharded};

// "all_layers", "per_layer", "index_sharded".
std::string_view send_strategy_name(SendStrategy strategy);

// Parses one of the names above. Error: InvalidArgument naming the value and listing the
// valid names.
Result<SendStrategy> parse_send_strategy(std::string_view name);

// The strategy a transport uses unless told otherwise. The one table, pinned by a test.
SendStrategy default_send_strategy(TransportKind transport);

}  // namespace kvferry::kv
