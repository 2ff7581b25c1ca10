// JsonFields: reads one JSON object of a kvferry format field by field, with typed required
// and optional fields and errors that name the field (its full path: "head_slice.tp_rank",
// "src_pages[3]") and quote the bad value through json_excerpt (never dump(): a hostile
// document could be nested a million levels deep).
//
// Used by every reader of kvferry's own JSON: segment descriptors (metadata/), bootstrap
// records (pd/), plan requests (kv/).
//
// Unknown fields are REJECTED: finish() fails naming the first field (in key order) that no
// read asked for, so call it after reading every field the format has. Why rejected rather
// than ignored: a misspelt optional field ("coalsce", "max_page_per_call") that is silently
// ignored gives a wrong result with no error, which is far worse than a refusal; and every
// kvferry format carries its version ("format" in a descriptor, the protocol versions of the
// binary frames), so a format that grows fields says so in its version instead of relying
// on old readers skipping what they do not know. Unknown *values* in an open set (a transport
// name a newer peer serves) are the format's own business, not this reader's.
//
// Documents kvferry does not define (etcd's JSON gateway replies) are not read with this:
// their schema is someone else's and grows without asking us.
//
// Thread-safety: plain values; one object per thread. The json object must outlive the
// reader.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/json_excerpt.h"
#include "kvferry/status.h"

namespace kvferry {

// How a reader reports errors: the code (ProtocolError for what a peer sent, InvalidArgument
// for what a user wrote) and a context that starts every message ("malformed segment
// descriptor"; empty for none).
struct JsonErrors {
  StatusCode code = StatusCode::kInvalidArgument;
  std::string context;

  Status make(std::string message) const {
    return {code, context.empty() ? std::move(message) : context + ": " + message};
  }
};

namespace json_detail {

template <typename T>
std::string expected_type() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_unsigned_v<T>) {
    if constexpr (sizeof(T) == sizeof(uint64_t)) return "a non-negative integer";
    return "a non-negative integer up to " + std::to_string(std::numeric_limits<T>::max());
  } else {
    return "a " + std::to_string(sizeof(T) * 8) + "-bit signed integer";
  }
}

template <typename T>
bool fits(const nlohmann::json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v.is_boolean();
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v.is_string();
  } else if constexpr (std::is_unsigned_v<T>) {
    return v.is_number_unsigned() && v.get<uint64_t>() <= std::numeric_limits<T>::max();
  } else {
    static_assert(std::is_integral_v<T> && std::is_signed_v<T>, "unsupported field type");
    // nlohmann keeps a non-negative literal as unsigned: 2^64-1 must not wrap to -1.
    if (v.is_number_unsigned()) {
      return v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max());
    }
    return v.is_number_integer() && v.get<int64_t>() >= std::numeric_limits<T>::min() &&
           v.get<int64_t>() <= std::numeric_limits<T>::max();
  }
}

}  // namespace json_detail

// `value` as a T, or an error naming `path` and quoting the value.
template <typename T>
Result<T> json_value_as(const nlohmann::json& value, std::string_view path,
                        const JsonErrors& errors) {
  if (!json_detail::fits<T>(value)) {
    return errors.make("field '" + std::string(path) + "' is not " +
                       json_detail::expected_type<T>() + ": " + json_excerpt(value));
  }
  return value.get<T>();
}

class JsonFields {
 public:
  // Reads `value`, which must be an object; `what` names it in the error otherwise
  // ("registration", "region").
  static Result<JsonFields> of(const nlohmann::json& value, std::string_view what,
                               JsonErrors errors) {
    if (!value.is_object()) {
      return errors.make(std::string(what) + " is not an object: " + json_excerpt(value));
    }
    return JsonFields(value, std::move(errors), "");
  }

  // The field, which must be present. Marks it as known.
  Result<const nlohmann::json*> required_value(std::string_view key) {
    const nlohmann::json* v = optional_value(key);
    if (v == nullptr) return errors_.make("missing field '" + path(key) + "'");
    return v;
  }
  // The field or nullptr when absent. Marks it as known.
  const nlohmann::json* optional_value(std::string_view key) {
    known_.emplace_back(key);
    auto it = object_->find(key);
    return it == object_->end() ? nullptr : &*it;
  }

  template <typename T>
  Result<T> required(std::string_view key) {
    KVF_ASSIGN_OR_RETURN(const nlohmann::json* v, required_value(key));
    return json_value_as<T>(*v, path(key), errors_);
  }
  template <typename T>
  Result<std::optional<T>> optional(std::string_view key) {
    const nlohmann::json* v = optional_value(key);
    if (v == nullptr) return std::optional<T>();
    KVF_ASSIGN_OR_RETURN(T value, json_value_as<T>(*v, path(key), errors_));
    return std::optional<T>(std::move(value));
  }
  // Into `out`; an absent optional field leaves `out` as it is (its default).
  template <typename T>
  Status required(std::string_view key, T& out) {
    KVF_ASSIGN_OR_RETURN(out, required<T>(key));
    return Status::Ok();
  }
  template <typename T>
  Status optional(std::string_view key, T& out) {
    KVF_ASSIGN_OR_RETURN(std::optional<T> value, optional<T>(key));
    if (value) out = std::move(*value);
    return Status::Ok();
  }

  // An array field, each element a T; elements are named "key[i]" in errors.
  template <typename T>
  Result<std::vector<T>> required_list(std::string_view key) {
    KVF_ASSIGN_OR_RETURN(const nlohmann::json* v, required_value(key));
    return list_of<T>(*v, key);
  }
  template <typename T>
  Result<std::optional<std::vector<T>>> optional_list(std::string_view key) {
    const nlohmann::json* v = optional_value(key);
    if (v == nullptr) return std::optional<std::vector<T>>();
    KVF_ASSIGN_OR_RETURN(std::vector<T> list, list_of<T>(*v, key));
    return std::optional<std::vector<T>>(std::move(list));
  }
  // An array field of any elements (the caller reads them).
  Result<const nlohmann::json*> required_array(std::string_view key) {
    KVF_ASSIGN_OR_RETURN(const nlohmann::json* v, required_value(key));
    if (!v->is_array()) return not_a(key, "an array", *v);
    return v;
  }

  // A nested object field, read with its own JsonFields (paths "key.field").
  Result<JsonFields> required_object(std::string_view key) {
    KVF_ASSIGN_OR_RETURN(const nlohmann::json* v, required_value(key));
    return nested(key, *v);
  }
  Result<std::optional<JsonFields>> optional_object(std::string_view key) {
    const nlohmann::json* v = optional_value(key);
    if (v == nullptr) return std::optional<JsonFields>();
    KVF_ASSIGN_OR_RETURN(JsonFields fields, nested(key, *v));
    return std::optional<JsonFields>(std::move(fields));
  }

  // Fails naming the first field no read asked for (the unknown-field policy above).
  Status finish() const {
    for (const auto& [key, unused] : object_->items()) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        return errors_.make("unknown field '" + path(key) + "'");
      }
    }
    return Status::Ok();
  }

  // An error about a field whose value is well-typed but wrong: "field 'page_size': is 0".
  Status field_error(std::string_view key, std::string_view what) const {
    return errors_.make("field '" + path(key) + "': " + std::string(what));
  }
  const JsonErrors& errors() const { return errors_; }
  // The field's full name in messages ("head_slice.tp_rank").
  std::string path(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  JsonFields(const nlohmann::json& object, JsonErrors errors, std::string prefix)
      : object_(&object), errors_(std::move(errors)), prefix_(std::move(prefix)) {}

  Status not_a(std::string_view key, std::string_view type, const nlohmann::json& v) const {
    return errors_.make("field '" + path(key) + "' is not " + std::string(type) + ": " +
                        json_excerpt(v));
  }
  Result<JsonFields> nested(std::string_view key, const nlohmann::json& v) const {
    if (!v.is_object()) return not_a(key, "an object", v);
    return JsonFields(v, errors_, path(key) + ".");
  }
  template <typename T>
  Result<std::vector<T>> list_of(const nlohmann::json& v, std::string_view key) const {
    if (!v.is_array()) return not_a(key, "an array", v);
    std::vector<T> out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      KVF_ASSIGN_OR_RETURN(
          T element, json_value_as<T>(v[i], path(key) + "[" + std::to_string(i) + "]", errors_));
      out.push_back(std::move(element));
    }
    return out;
  }

  const nlohmann::json* object_;
  JsonErrors errors_;
  std::string prefix_;
  std::vector<std::string> known_;
};

}  // namespace kvferry
