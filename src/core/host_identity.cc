#include "core/host_identity.h"

#include <unistd.h>

#include <array>
#include <fstream>

namespace kvferry {

const std::string& host_identity() {
  static const std::string id = [] {
    std::string boot_id;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, boot_id);
    std::array<char, 128> ns{};
    ssize_t n = ::readlink("/proc/self/ns/pid", ns.data(), ns.size() - 1);
    std::string pid_ns = n > 0 ? std::string(ns.data(), static_cast<size_t>(n)) : "pid:[?]";
    return boot_id + "/" + pid_ns;
  }();
  return id;
}

}  // namespace kvferry
