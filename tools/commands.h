// Subcommands of the kvferry CLI. Each lives in its own file and registers itself on the
// app; main.cc only wires them. Commands parse flags and call the library, nothing more.
#pragma once

#include <CLI/CLI.hpp>

namespace kvferry::cli {

void add_bench_command(CLI::App& app);
void add_bootstrap_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_doctor_command(CLI::App& app);
void add_pd_decode_command(CLI::App& app);
void add_pd_prefill_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_serve_command(CLI::App& app);

}  // namespace kvferry::cli
