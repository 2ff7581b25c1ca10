// Network namespaces for tests that need more than one "host": a namespace that is deleted
// with its object, veth pairs between namespaces (or to the test's own namespace), and the
// argv prefix that runs a child inside one. Needs root and iproute2; tests skip (never pass)
// when netns_unavailable() gives a reason.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace kvferry::testing {

inline constexpr char kIp[] = "/usr/sbin/ip";
inline constexpr char kUnshare[] = "/usr/bin/unshare";

inline int run_quietly(const std::string& command) {
  return std::system((command + " >/dev/null 2>&1").c_str());
}

// Why network namespaces cannot be made here, or empty when they can.
inline std::string netns_unavailable() {
  if (::geteuid() != 0) return "needs root for network namespaces";
  if (::access(kIp, X_OK) != 0) return std::string(kIp) + " (iproute2) is not installed";
  return "";
}

// A named network namespace with its loopback up; `ip netns del` when destroyed (which also
// removes the veth ends inside it). Move-only.
class NetNamespace {
 public:
  NetNamespace() = default;
  // False when `ip netns add` failed (the object then owns nothing).
  bool create(std::string name) {
    name_ = std::move(name);
    owned_ =
        run_quietly(fmt::format("{0} netns add {1} && {0} -n {1} link set lo up", kIp, name_)) == 0;
    return owned_;
  }
  NetNamespace(NetNamespace&& o) noexcept
      : name_(std::move(o.name_)), owned_(std::exchange(o.owned_, false)) {}
  NetNamespace& operator=(NetNamespace&&) = delete;
  ~NetNamespace() {
    if (owned_) run_quietly(fmt::format("{} netns del {}", kIp, name_));
  }

  const std::string& name() const { return name_; }
  // Runs a shell command inside the namespace; returns its exit status.
  int run(const std::string& command) const {
    return run_quietly(fmt::format("{} netns exec {} sh -c '{}'", kIp, name_, command));
  }
  // argv prefix that starts a program inside the namespace (`ip netns exec` execs it: the
  // child's pid is the program's).
  std::vector<std::string> exec_prefix() const { return {kIp, "netns", "exec", name_}; }

 private:
  std::string name_;
  bool owned_ = false;
};

// One end of a veth pair: in namespace `ns` (empty: the test's own), named `dev`, with
// address `cidr` ("10.1.0.2/24"; empty: none).
struct VethEnd {
  std::string ns;
  std::string dev;
  std::string cidr;
};

// Creates the pair and brings both ends up. False on failure.
inline bool add_veth_pair(const VethEnd& a, const VethEnd& b) {
  auto in = [](const VethEnd& end) {
    return end.ns.empty() ? std::string(kIp) : fmt::format("{} -n {}", kIp, end.ns);
  };
  std::string commands = fmt::format("{} link add {} type veth peer name {}", kIp, a.dev, b.dev);
  for (const VethEnd* end : {&a, &b}) {
    if (!end->ns.empty())
      commands += fmt::format(" && {} link set {} netns {}", kIp, end->dev, end->ns);
    if (!end->cidr.empty()) {
      commands += fmt::format(" && {} addr add {} dev {}", in(*end), end->cidr, end->dev);
    }
    commands += fmt::format(" && {} link set {} up", in(*end), end->dev);
  }
  return run_quietly(commands) == 0;
}

}  // namespace kvferry::testing
