// kvferry: command-line entry point. See README.md for the commands.
#include <CLI/CLI.hpp>

#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvferry: moves LLM KV cache between prefill and decode workers"};
  app.require_subcommand(1);
  // Every option's --help line shows its default (subcommands inherit this).
  app.option_defaults()->always_capture_default();
  kvferry::cli::add_demo_command(app);
  kvferry::cli::add_doctor_command(app);
  kvferry::cli::add_bench_command(app);
  kvferry::cli::add_serve_command(app);
  kvferry::cli::add_plan_command(app);
  kvferry::cli::add_bootstrap_command(app);
  kvferry::cli::add_pd_prefill_command(app);
  kvferry::cli::add_pd_decode_command(app);
  CLI11_PARSE(app, argc, argv);
  return app.get_subcommands().empty() ? 2 : 0;
}
