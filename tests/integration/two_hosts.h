// Two hosts on one machine, for integration tests: a network namespace joined to ours by a
// veth pair with addresses from 198.18.0.0/15 (the range reserved for benchmarking), and a
// launcher that runs a command in it inside its own pid namespace, so its host identity
// (boot_id + pid namespace) differs from ours. Needs root, iproute2 and util-linux's
// unshare; `setup()` says why it cannot (the caller skips, never passes).
//
// Thread-safety: one object per test, used from the test's thread.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace kvferry::testing {

class TwoHostNamespaces {
 public:
  static constexpr char kIp[] = "/usr/sbin/ip";
  static constexpr char kUnshare[] = "/usr/bin/unshare";

  TwoHostNamespaces() = default;
  TwoHostNamespaces(const TwoHostNamespaces&) = delete;
  TwoHostNamespaces& operator=(const TwoHostNamespaces&) = delete;
  ~TwoHostNamespaces() {
    if (created_) run_quietly(fmt::format("{0} netns del {1}; {0} link del {1}a", kIp, ns_));
  }

  // Creates the namespace and its link; "" on success, else why not (for GTEST_SKIP).
  // `prefix` names the namespace (with the pid, so parallel test processes do not collide).
  std::string setup(const std::string& prefix = "kvh") {
    if (::geteuid() != 0) return "needs root for network and pid namespaces";
    for (const char* tool : {kIp, kUnshare}) {
      if (::access(tool, X_OK) != 0) return std::string(tool) + " is not installed";
    }
    const int pid = ::getpid();
    ns_ = fmt::format("{}{}", prefix, pid);
    const std::string subnet = fmt::format("198.{}.{}", 18 + (pid / 256) % 2, pid % 256);
    local_ip_ = subnet + ".1";
    peer_ip_ = subnet + ".2";
    created_ = true;  // from here on the destructor removes whatever got created
    const std::string setup = fmt::format(
        "{0} netns add {1} && {0} link add {1}a type veth peer name {1}b && "
        "{0} link set {1}b netns {1} && {0} addr add {2}/24 dev {1}a && "
        "{0} link set {1}a up && {0} -n {1} addr add {3}/24 dev {1}b && "
        "{0} -n {1} link set {1}b up && {0} -n {1} link set lo up",
        kIp, ns_, local_ip_, peer_ip_);
    if (run_quietly(setup) != 0) {
      return "cannot create a network namespace joined by a veth pair here";
    }
    if (run_quietly(fmt::format("{} netns exec {} {} --pid --fork --kill-child --mount-proc true",
                                kIp, ns_, kUnshare)) != 0) {
      return "cannot create a pid namespace (unshare --pid) here";
    }
    return "";
  }

  // Words that run a command on the other host (its network and pid namespaces); `env`
  // (NAME=value words) is set for the command there.
  std::vector<std::string> launcher(const std::vector<std::string>& env = {}) const {
    std::vector<std::string> words = {kIp, "netns", "exec", ns_};
    if (!env.empty()) {
      words.emplace_back("/usr/bin/env");
      words.insert(words.end(), env.begin(), env.end());
    }
    words.insert(words.end(), {kUnshare, "--pid", "--fork", "--kill-child", "--mount-proc"});
    return words;
  }

  const std::string& ns() const { return ns_; }
  std::string local_device() const { return ns_ + "a"; }  // our end of the veth pair
  std::string peer_device() const { return ns_ + "b"; }   // the other host's end
  const std::string& local_ip() const { return local_ip_; }
  const std::string& peer_ip() const { return peer_ip_; }

 private:
  static int run_quietly(const std::string& command) {
    return std::system((command + " >/dev/null 2>&1").c_str());
  }

  std::string ns_;
  std::string local_ip_;
  std::string peer_ip_;
  bool created_ = false;
};

}  // namespace kvferry::testing
