// The loom subcommands, one file each (train.cpp holds train, eval and bench, which share the
// Trainer; data.cpp holds data tokenize and data export): each adds its subcommand and options to
// the CLI11 app and returns what runs it once parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace loom::cli {

// A subcommand: its CLI11 entry (true once parsed) and its work, which returns the process's exit
// code and throws Loom's errors for main to report.
struct Command {
  const CLI::App* parsed;
  std::function<int()> run;
};

// The help of the options that name a job: its config file and overrides of its keys.
inline constexpr const char* kConfigHelp = "Job config file";
inline constexpr const char* kOverrideHelp = "Override a config key: key=value (repeatable)";

Command add_train(CLI::App& loom);     // train.cpp
Command add_eval(CLI::App& loom);      // train.cpp
Command add_bench(CLI::App& loom);     // train.cpp
Command add_run(CLI::App& loom);       // run.cpp
Command add_forward(CLI::App& loom);   // forward.cpp
Command add_shapes(CLI::App& loom);    // shapes.cpp
Command add_export(CLI::App& loom);    // export.cpp
Command add_chat(CLI::App& loom);      // generate.cpp
Command add_generate(CLI::App& loom);  // generate.cpp
// `data` and its subcommands tokenize and export (data.cpp).
std::vector<Command> add_data(CLI::App& loom);

}  // namespace loom::cli
