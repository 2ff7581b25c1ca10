// ProcessFigures: what this process holds right now, read from /proc/self: threads (entries
// of task/), resident memory (VmRSS of status) and open file descriptors (entries of fd/).
// `bench scale` reads them before and after opening peers, so the difference is the cost of
// the peers. Each figure reads 0 when /proc cannot be read.
//
// Thread-safety: reads only /proc; safe from any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

namespace kvferry::cli {

struct ProcessFigures {
  uint64_t threads = 0;
  uint64_t rss_kib = 0;
  uint64_t fds = 0;
};

// The VmRSS line of a /proc/<pid>/status text ("VmRSS:\t  12345 kB"), in KiB; 0 without one.
inline uint64_t parse_vm_rss_kib(std::string_view status_text) {
  constexpr std::string_view kKey = "VmRSS:";
  size_t at = 0;
  while (at < status_text.size()) {
    const size_t end = std::min(status_text.find('\n', at), status_text.size());
    const std::string_view line = status_text.substr(at, end - at);
    if (line.substr(0, kKey.size()) == kKey) {
      std::istringstream fields{std::string(line.substr(kKey.size()))};
      uint64_t kib = 0;
      std::string unit;
      if (fields >> kib >> unit && unit == "kB") return kib;
      return 0;
    }
    at = end + 1;
  }
  return 0;
}

inline uint64_t count_directory_entries(const std::filesystem::path& dir) {
  std::error_code ec;
  uint64_t n = 0;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    ++n;
  }
  return n;
}

inline ProcessFigures read_process_figures() {
  ProcessFigures out;
  out.threads = count_directory_entries("/proc/self/task");
  // Counting fd/ opens one descriptor for the listing itself; every reading counts it alike,
  // so differences are exact.
  out.fds = count_directory_entries("/proc/self/fd");
  std::ifstream status("/proc/self/status");
  std::ostringstream text;
  text << status.rdbuf();
  out.rss_kib = parse_vm_rss_kib(text.str());
  return out;
}

}  // namespace kvferry::cli
