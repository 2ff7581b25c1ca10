// `kvferry doctor`: what this machine offers and why each route would or would not be
// taken (tools/doctor_checks.h), as text or --json. Exit code 0: usable (no check failed);
// 1: something is wrong (a check says FAIL, and why).
#include <fmt/format.h>

#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/logging.h"
#include "doctor_checks.h"

namespace kvferry::cli {
namespace {

constexpr int kExitSomethingWrong = 1;

struct DoctorArgs {
  std::string peer;
  bool json = false;
};

int run_doctor(const DoctorArgs& args) {
  // The engines the peer check starts log every refused route; the report says it all.
  if (std::getenv("KVFERRY_LOG_LEVEL") == nullptr) log().set_level(spdlog::level::err);
  std::vector<Check> checks = machine_checks();
  PeerReport peer;
  if (!args.peer.empty()) {
    peer = check_peer(args.peer);
    checks.push_back(peer.check);
  }
  bool ok = true;
  for (const Check& c : checks) ok = ok && c.verdict != Verdict::kFail;
  if (args.json) {
    nlohmann::json out = {{"usable", ok}, {"checks", nlohmann::json::array()}};
    for (const Check& c : checks) {
      out["checks"].push_back({{"name", c.name},
                               {"verdict", verdict_name(c.verdict)},
                               {"value", c.value},
                               {"detail", c.detail}});
    }
    if (!args.peer.empty()) out["routes"] = peer.routes;
    std::cout << out.dump(2) << "\n";
  } else {
    for (const Check& c : checks) {
      std::cout << fmt::format("{:<20} {:<5} {}\n{:<27}{}\n", c.name, verdict_name(c.verdict),
                               c.value, "", c.detail);
    }
    for (const nlohmann::json& r : peer.routes) {
      const std::string via = r["transport"].is_null() ? "none" : r["transport"].get<std::string>();
      std::cout << fmt::format("route {:>11} -> {:<11} {:<8} {}\n", r["local"].get<std::string>(),
                               r["remote"].get<std::string>(), via, r["reason"].get<std::string>());
      for (const nlohmann::json& o : r["others"]) {
        std::cout << fmt::format("{:<35}{:<8} out: {}\n", "", o["transport"].get<std::string>(),
                                 o["out"].get<std::string>());
      }
    }
    std::cout << (ok ? "verdict: usable\n" : "verdict: something is wrong (see FAIL above)\n");
  }
  return ok ? 0 : kExitSomethingWrong;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "what this machine offers the transports, and the routes to a peer");
  cmd->add_option("--peer", args->peer, "a peer's endpoint (host:port): the route per memory kind");
  cmd->add_flag("--json", args->json, "print JSON for scripts");
  cmd->callback([args] {
    const int code = run_doctor(*args);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace kvferry::cli
