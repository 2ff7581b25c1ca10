#include "pd/bootstrap_json.h"

#include <limits>

#include "core/json_excerpt.h"

namespace kvferry::pd {
namespace {

using nlohmann::json;

template <typename T>
Status get_uint(const json& j, const char* key, T& out, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    return required ? InvalidArgument(std::string("missing field '") + key + "'") : Status::Ok();
  }
  if (!it->is_number_unsigned() || it->get<uint64_t>() > std::numeric_limits<T>::max()) {
    return InvalidArgument(std::string("field '") + key + "' is " + json_excerpt(*it) +
                           ", expected an unsigned integer");
  }
  out = it->get<T>();
  return Status::Ok();
}

Status get_string(const json& j, const char* key, std::string& out) {
  auto it = j.find(key);
  if (it == j.end()) return InvalidArgument(std::string("missing field '") + key + "'");
  if (!it->is_string() || it->get_ref<const std::string&>().empty()) {
    return InvalidArgument(std::string("field '") + key + "' is " + json_excerpt(*it) +
                           ", expected a non-empty string");
  }
  out = it->get<std::string>();
  return Status::Ok();
}

Status check_rank(const char* what, uint32_t rank, uint32_t size) {
  if (size == 0 || rank >= size) {
    return InvalidArgument(std::string(what) + " rank " + std::to_string(rank) + " of size " +
                           std::to_string(size));
  }
  return Status::Ok();
}

}  // namespace

json to_json(const RankRegistration& r) {
  return {{"tp_rank", r.tp_rank},
          {"tp_size", r.tp_size},
          {"pp_rank", r.pp_rank},
          {"pp_size", r.pp_size},
          {"cp_rank", r.cp_rank},
          {"cp_size", r.cp_size},
          {"dp_rank", r.dp_rank},
          {"dp_size", r.dp_size},
          {"control_endpoint", r.control_endpoint},
          {"engine_endpoint", r.engine_endpoint},
          {"incarnation", r.incarnation},
          {"page_size", r.page_size_tokens},
          {"dtype_bytes", r.dtype_bytes}};
}

json to_json(const InstanceLayout& l) {
  return {{"tp_size", l.tp_size},
          {"pp_size", l.pp_size},
          {"cp_size", l.cp_size},
          {"dp_size", l.dp_size},
          {"page_size", l.page_size_tokens},
          {"dtype_bytes", l.dtype_bytes}};
}

json to_json(const HealthReport& h) {
  json ranks = json::array();
  for (const RankHealth& r : h.ranks) {
    ranks.push_back({{"tp_rank", r.tp_rank},
                     {"pp_rank", r.pp_rank},
                     {"cp_rank", r.cp_rank},
                     {"dp_rank", r.dp_rank},
                     {"incarnation", r.incarnation},
                     {"alive", r.alive}});
  }
  return {{"healthy", h.healthy}, {"ranks", ranks}};
}

Result<RankRegistration> rank_from_json(const json& j) {
  if (!j.is_object()) return InvalidArgument("registration is not a JSON object");
  RankRegistration r;
  KVF_RETURN_IF_ERROR(get_uint(j, "tp_rank", r.tp_rank, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "tp_size", r.tp_size, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "pp_rank", r.pp_rank, false));
  KVF_RETURN_IF_ERROR(get_uint(j, "pp_size", r.pp_size, false));
  KVF_RETURN_IF_ERROR(get_uint(j, "cp_rank", r.cp_rank, false));
  KVF_RETURN_IF_ERROR(get_uint(j, "cp_size", r.cp_size, false));
  KVF_RETURN_IF_ERROR(get_uint(j, "dp_rank", r.dp_rank, false));
  KVF_RETURN_IF_ERROR(get_uint(j, "dp_size", r.dp_size, false));
  KVF_RETURN_IF_ERROR(get_string(j, "control_endpoint", r.control_endpoint));
  KVF_RETURN_IF_ERROR(get_string(j, "engine_endpoint", r.engine_endpoint));
  KVF_RETURN_IF_ERROR(get_uint(j, "incarnation", r.incarnation, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "page_size", r.page_size_tokens, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "dtype_bytes", r.dtype_bytes, false));
  KVF_RETURN_IF_ERROR(check_rank("tp", r.tp_rank, r.tp_size));
  KVF_RETURN_IF_ERROR(check_rank("pp", r.pp_rank, r.pp_size));
  KVF_RETURN_IF_ERROR(check_rank("cp", r.cp_rank, r.cp_size));
  KVF_RETURN_IF_ERROR(check_rank("dp", r.dp_rank, r.dp_size));
  if (r.page_size_tokens == 0) return InvalidArgument("field 'page_size' is 0");
  return r;
}

Result<InstanceLayout> layout_from_json(const json& j) {
  if (!j.is_object()) return InvalidArgument("layout is not a JSON object");
  InstanceLayout l;
  KVF_RETURN_IF_ERROR(get_uint(j, "tp_size", l.tp_size, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "pp_size", l.pp_size, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "cp_size", l.cp_size, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "dp_size", l.dp_size, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "page_size", l.page_size_tokens, true));
  KVF_RETURN_IF_ERROR(get_uint(j, "dtype_bytes", l.dtype_bytes, false));
  if (l.tp_size == 0) return InvalidArgument("field 'tp_size' is 0");
  return l;
}

Result<HealthReport> health_from_json(const json& j) {
  if (!j.is_object() || !j.contains("healthy") || !j["healthy"].is_boolean() ||
      !j.contains("ranks") || !j["ranks"].is_array()) {
    return InvalidArgument("health report lacks 'healthy' or 'ranks'");
  }
  HealthReport h;
  h.healthy = j["healthy"].get<bool>();
  for (const json& r : j["ranks"]) {
    if (!r.is_object()) return InvalidArgument("health rank is not an object");
    RankHealth rh;
    KVF_RETURN_IF_ERROR(get_uint(r, "tp_rank", rh.tp_rank, true));
    KVF_RETURN_IF_ERROR(get_uint(r, "pp_rank", rh.pp_rank, false));
    KVF_RETURN_IF_ERROR(get_uint(r, "cp_rank", rh.cp_rank, false));
    KVF_RETURN_IF_ERROR(get_uint(r, "dp_rank", rh.dp_rank, false));
    KVF_RETURN_IF_ERROR(get_uint(r, "incarnation", rh.incarnation, true));
    if (!r.contains("alive") || !r["alive"].is_boolean()) {
      return InvalidArgument("health rank lacks 'alive'");
    }
    rh.alive = r["alive"].get<bool>();
    h.ranks.push_back(rh);
  }
  return h;
}

}  // namespace kvferry::pd
