// JSON forms of the bootstrap records, shared by server and client. Parsing (through
// core/json_fields.h) checks every field's presence and type, names the first bad one, and
// rejects unknown fields.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>

#include "kvferry/pd/bootstrap.h"

namespace kvferry::pd {

nlohmann::json to_json(const RankRegistration& rank);
nlohmann::json to_json(const InstanceLayout& layout);
nlohmann::json to_json(const HealthReport& health);

// InvalidArgument naming the missing or malformed field.
Result<RankRegistration> rank_from_json(const nlohmann::json& j);
Result<InstanceLayout> layout_from_json(const nlohmann::json& j);
Result<HealthReport> health_from_json(const nlohmann::json& j);

}  // namespace kvferry::pd
