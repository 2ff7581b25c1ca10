// `kvferry bench <what>`: scenario benchmarks that print ratios against a reference
// measured in the same run.
#include <unistd.h>

#include <array>

#include "commands.h"
#include "serve_client.h"

namespace kvferry::cli {

void add_bench_engine_command(CLI::App& bench);
void add_bench_kv_command(CLI::App& bench);
void add_bench_scale_command(CLI::App& bench);

std::string self_executable() {
  std::array<char, 4096> path{};
  ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size() - 1);
  return n > 0 ? std::string(path.data(), static_cast<size_t>(n)) : std::string("kvferry");
}

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "benchmarks (ratios against same-run references)");
  bench->require_subcommand(1);
  add_bench_engine_command(*bench);
  add_bench_kv_command(*bench);
  add_bench_scale_command(*bench);
}

}  // namespace kvferry::cli
