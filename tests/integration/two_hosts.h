// Two hosts on one machine, for integration tests: a network namespace joined to ours by a
// veth pair with addresses from 198.18.0.0/15 (the range reserved for benchmarking), and a
// launcher that runs a command in it inside its own pid namespace, so its host identity
// (boot_id + pid namespace) differs from ours. Built on netns_support.h. Needs root,
// iproute2 and util-linux's unshare; `setup()` says why it cannot (the caller skips, never
// passes).
//
// Thread-safety: one object per test, used from the test's thread.
#pragma once

#include <fmt/format.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "netns_support.h"

namespace kvferry::testing {

class TwoHostNamespaces {
 public:
  TwoHostNamespaces() = default;
  TwoHostNamespaces(const TwoHostNamespaces&) = delete;
  TwoHostNamespaces& operator=(const TwoHostNamespaces&) = delete;
  ~TwoHostNamespaces() {
    // Our end of the pair; the other end goes with the namespace (NetNamespace).
    if (linked_) run_quietly(fmt::format("{} link del {}", kIp, local_device()));
  }

  // Creates the namespace and its link; "" on success, else why not (for GTEST_SKIP).
  // `prefix` names the namespace (with the pid, so parallel test processes do not collide).
  std::string setup(const std::string& prefix = "kvh") {
    if (std::string why = netns_unavailable(); !why.empty()) return why;
    if (::access(kUnshare, X_OK) != 0) return std::string(kUnshare) + " is not installed";
    const int pid = ::getpid();
    const std::string subnet = fmt::format("198.{}.{}", 18 + (pid / 256) % 2, pid % 256);
    local_ip_ = subnet + ".1";
    peer_ip_ = subnet + ".2";
    if (!netns_.create(fmt::format("{}{}", prefix, pid))) {
      return "cannot create a network namespace here";
    }
    linked_ = add_veth_pair({"", local_device(), local_ip_ + "/24"},
                            {netns_.name(), peer_device(), peer_ip_ + "/24"});
    if (!linked_) return "cannot join a network namespace by a veth pair here";
    if (run_quietly(fmt::format("{} netns exec {} {} --pid --fork --kill-child --mount-proc true",
                                kIp, netns_.name(), kUnshare)) != 0) {
      return "cannot create a pid namespace (unshare --pid) here";
    }
    return "";
  }

  // Words that run a command on the other host (its network and pid namespaces); `env`
  // (NAME=value words) is set for the command there.
  std::vector<std::string> launcher(const std::vector<std::string>& env = {}) const {
    std::vector<std::string> words = netns_.exec_prefix();
    if (!env.empty()) {
      words.emplace_back("/usr/bin/env");
      words.insert(words.end(), env.begin(), env.end());
    }
    words.insert(words.end(), {kUnshare, "--pid", "--fork", "--kill-child", "--mount-proc"});
    return words;
  }

  const std::string& ns() const { return netns_.name(); }
  std::string local_device() const { return netns_.name() + "a"; }  // our end of the pair
  std::string peer_device() const { return netns_.name() + "b"; }   // the other host's end
  const std::string& local_ip() const { return local_ip_; }
  const std::string& peer_ip() const { return peer_ip_; }

 private:
  NetNamespace netns_;
  std::string local_ip_;
  std::string peer_ip_;
  bool linked_ = false;
};

}  // namespace kvferry::testing
