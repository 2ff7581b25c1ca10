// `kvferry plan`: reads a plan request (JSON) on stdin or from --input, prints the plan the
// planner builds for it as JSON on stdout. Field reference: docs/PLAN_FORMAT.md.
//
// Exit codes: 0 plan printed; 1 the input could not be read; 2 the request is invalid (the
// message on stderr names the field and the value).
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "commands.h"
#include "kvferry/kv/plan_json.h"

namespace kvferry::cli {
namespace {

constexpr int kExitUnreadableInput = 1;
constexpr int kExitInvalidRequest = 2;

Result<std::string> read_input(const std::string& path) {
  if (path.empty() || path == "-") {
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) return ErrnoStatus(StatusCode::kInvalidArgument, "cannot open --input " + path, errno);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto input = std::make_shared<std::string>();
  CLI::App* cmd =
      app.add_subcommand("plan", "print the transfer plan for a JSON request (stdin or --input)");
  cmd->add_option("--input", *input, "request file (default: stdin)");
  cmd->callback([input] {
    Result<std::string> text = read_input(*input);
    if (!text.ok()) {
      std::cerr << "kvferry plan: " << text.status().to_string() << "\n";
      throw CLI::RuntimeError(kExitUnreadableInput);
    }
    Result<kv::PlanRequest> request = kv::parse_plan_request(*text);
    if (!request.ok()) {
      std::cerr << "kvferry plan: " << request.status().to_string() << "\n";
      throw CLI::RuntimeError(kExitInvalidRequest);
    }
    Result<kv::TransferPlan> plan = kv::build_requested_plan(*request);
    if (!plan.ok()) {
      std::cerr << "kvferry plan: " << plan.status().to_string() << "\n";
      throw CLI::RuntimeError(kExitInvalidRequest);
    }
    std::cout << kv::plan_to_json(*plan) << "\n";
  });
}

}  // namespace kvferry::cli
