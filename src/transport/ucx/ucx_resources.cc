#include "transport/ucx/ucx_resources.h"

#include <array>

namespace kvferry::detail {
namespace {

constexpr std::string_view kResourceTag = "resource";
constexpr std::string_view kTransportSeparator = "-- ";
constexpr std::array<std::string_view, 3> kHardwareRmaPrefixes = {"rc", "dc", "ud"};
constexpr std::array<std::string_view, 2> kVerbsSuffixes = {"_verbs", "_mlx5"};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace

std::vector<std::string> parse_ucx_resource_lines(std::string_view printed) {
  std::vector<std::string> out;
  while (!printed.empty()) {
    size_t end = printed.find('\n');
    std::string_view line = printed.substr(0, end);
    printed = end == std::string_view::npos ? std::string_view{} : printed.substr(end + 1);
    line = trim(line);
    if (!line.starts_with('#')) continue;
    line = trim(line.substr(1));
    if (!line.starts_with(kResourceTag)) continue;
    size_t sep = line.find(kTransportSeparator);
    if (sep == std::string_view::npos) continue;
    std::string_view transport = trim(line.substr(sep + kTransportSeparator.size()));
    if (!transport.empty()) out.emplace_back(transport);
  }
  return out;
}

bool is_hardware_rma_transport(std::string_view transport) {
  std::string_view name = transport.substr(0, transport.find('/'));
  for (std::string_view suffix : kVerbsSuffixes) {
    if (name.ends_with(suffix)) return true;
  }
  for (std::string_view prefix : kHardwareRmaPrefixes) {
    // "rc", "rc_x", "dc_mlx5": the prefix alone or followed by '_'.
    if (name == prefix ||
        (name.starts_with(prefix) && name.size() > prefix.size() && name[prefix.size()] == '_')) {
      return true;
    }
  }
  return false;
}

std::string join_transports(const std::vector<std::string>& transports) {
  std::string out;
  for (const std::string& t : transports) {
    if (!out.empty()) out += ", ";
    out += t;
  }
  return out.empty() ? "none" : out;
}

}  // namespace kvferry::detail
