// The loom subcommands, one file each (train.cpp holds train, eval and bench, which share the
// Trainer; data.cpp holds data tokenize and data export): each adds its subcommand and options to
// the CLI11 app and returns what runs it once parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>
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
// loom generate's video form (generate_video.cpp): a clip for `prompt` from a flow_matching job's
// checkpoint. Unset options (0, negative or empty) take the job's sample_* keys and data sizes.
struct VideoGeneration {
  std::string config_path, checkpoint, prompt, out_dir, solver;
  std::vector<std::string> overrides;
  int64_t frames = 0, steps = 0;
  double guidance = -1, shift = 0, fps = 8;
  uint64_t seed = 0;
};
int run_generate_video(const VideoGeneration& generation);

// `data` and its subcommands tokenize and export (data.cpp).
std::vector<Command> add_data(CLI::App& loom);

}  // namespace loom::cli
