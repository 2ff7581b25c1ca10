// json_excerpt: a JSON value as an error message may quote it.
//
// A container is named by its type, never dump()ed: dump() recurses once per nesting level,
// so a hostile document of deeply nested arrays would overflow the stack (nlohmann's parser
// and destructor are iterative, its serializer is not). Scalars are quoted, cut at 64 bytes.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace kvferry {

inline std::string json_excerpt(const nlohmann::json& value) {
  constexpr size_t kMaxQuotedBytes = 64;
  if (value.is_structured()) return std::string("an ") + value.type_name();
  std::string text = value.dump();
  if (text.size() > kMaxQuotedBytes) text = text.substr(0, kMaxQuotedBytes) + "...";
  return text;
}

}  // namespace kvferry
