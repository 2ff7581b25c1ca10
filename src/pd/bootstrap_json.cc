#include "pd/bootstrap_json.h"

#include <string>
#include <string_view>

#include "core/json_fields.h"

namespace kvferry::pd {
namespace {

using nlohmann::json;

const JsonErrors kErrors{StatusCode::kInvalidArgument, ""};

// A non-empty string field.
Status get_endpoint(JsonFields& f, std::string_view key, std::string& out) {
  KVF_RETURN_IF_ERROR(f.required(key, out));
  if (out.empty()) return f.field_error(key, "is empty, expected \"host:port\"");
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
  KVF_ASSIGN_OR_RETURN(JsonFields f, JsonFields::of(j, "registration", kErrors));
  RankRegistration r;
  KVF_RETURN_IF_ERROR(f.required("tp_rank", r.tp_rank));
  KVF_RETURN_IF_ERROR(f.required("tp_size", r.tp_size));
  KVF_RETURN_IF_ERROR(f.optional("pp_rank", r.pp_rank));
  KVF_RETURN_IF_ERROR(f.optional("pp_size", r.pp_size));
  KVF_RETURN_IF_ERROR(f.optional("cp_rank", r.cp_rank));
  KVF_RETURN_IF_ERROR(f.optional("cp_size", r.cp_size));
  KVF_RETURN_IF_ERROR(f.optional("dp_rank", r.dp_rank));
  KVF_RETURN_IF_ERROR(f.optional("dp_size", r.dp_size));
  KVF_RETURN_IF_ERROR(get_endpoint(f, "control_endpoint", r.control_endpoint));
  KVF_RETURN_IF_ERROR(get_endpoint(f, "engine_endpoint", r.engine_endpoint));
  KVF_RETURN_IF_ERROR(f.required("incarnation", r.incarnation));
  KVF_RETURN_IF_ERROR(f.required("page_size", r.page_size_tokens));
  KVF_RETURN_IF_ERROR(f.optional("dtype_bytes", r.dtype_bytes));
  KVF_RETURN_IF_ERROR(f.finish());
  KVF_RETURN_IF_ERROR(check_rank("tp", r.tp_rank, r.tp_size));
  KVF_RETURN_IF_ERROR(check_rank("pp", r.pp_rank, r.pp_size));
  KVF_RETURN_IF_ERROR(check_rank("cp", r.cp_rank, r.cp_size));
  KVF_RETURN_IF_ERROR(check_rank("dp", r.dp_rank, r.dp_size));
  if (r.page_size_tokens == 0) return f.field_error("page_size", "is 0");
  return r;
}

Result<InstanceLayout> layout_from_json(const json& j) {
  KVF_ASSIGN_OR_RETURN(JsonFields f, JsonFields::of(j, "layout", kErrors));
  InstanceLayout l;
  KVF_RETURN_IF_ERROR(f.required("tp_size", l.tp_size));
  KVF_RETURN_IF_ERROR(f.required("pp_size", l.pp_size));
  KVF_RETURN_IF_ERROR(f.required("cp_size", l.cp_size));
  KVF_RETURN_IF_ERROR(f.required("dp_size", l.dp_size));
  KVF_RETURN_IF_ERROR(f.required("page_size", l.page_size_tokens));
  KVF_RETURN_IF_ERROR(f.optional("dtype_bytes", l.dtype_bytes));
  KVF_RETURN_IF_ERROR(f.finish());
  if (l.tp_size == 0) return f.field_error("tp_size", "is 0");
  return l;
}

Result<HealthReport> health_from_json(const json& j) {
  KVF_ASSIGN_OR_RETURN(JsonFields f, JsonFields::of(j, "health report", kErrors));
  HealthReport h;
  KVF_RETURN_IF_ERROR(f.required("healthy", h.healthy));
  KVF_ASSIGN_OR_RETURN(const json* ranks, f.required_array("ranks"));
  KVF_RETURN_IF_ERROR(f.finish());
  for (const json& r : *ranks) {
    KVF_ASSIGN_OR_RETURN(JsonFields rf, JsonFields::of(r, "health rank", kErrors));
    RankHealth rh;
    KVF_RETURN_IF_ERROR(rf.required("tp_rank", rh.tp_rank));
    KVF_RETURN_IF_ERROR(rf.optional("pp_rank", rh.pp_rank));
    KVF_RETURN_IF_ERROR(rf.optional("cp_rank", rh.cp_rank));
    KVF_RETURN_IF_ERROR(rf.optional("dp_rank", rh.dp_rank));
    KVF_RETURN_IF_ERROR(rf.required("incarnation", rh.incarnation));
    KVF_RETURN_IF_ERROR(rf.required("alive", rh.alive));
    KVF_RETURN_IF_ERROR(rf.finish());
    h.ranks.push_back(rh);
  }
  return h;
}

}  // namespace kvferry::pd
