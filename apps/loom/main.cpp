// The loom command line: the app, its global options, and the dispatch to one subcommand (each in
// its own file, commands.h), with the one handler that reports any error on one line.
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "loom/util/log.h"
#include "startup.h"

using namespace loom;

int main(int argc, char** argv) {
  // A write to a socket whose peer died (a lost rank's store or Gloo connection) must be an error
  // Loom reports with the lost rank's name, not a SIGPIPE that ends this rank without a word: rank
  // 0, which serves the store, died so once while answering a killed rank.
  std::signal(SIGPIPE, SIG_IGN);
  cli::ensure_startup_environment(argv);
  cli::keep_freed_memory();
  CLI::App app{"Loom: trains multimodal models from one binary"};
  app.require_subcommand(1);
  app.fallthrough();  // the subcommands, which inherit it, take the app's options too: train x --log-level
                      // debug
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error");

  std::vector<cli::Command> commands = {cli::add_train(app),  cli::add_eval(app),    cli::add_bench(app),
                                        cli::add_run(app),    cli::add_forward(app), cli::add_shapes(app),
                                        cli::add_export(app), cli::add_chat(app),    cli::add_generate(app)};
  for (cli::Command& command : cli::add_data(app)) commands.push_back(std::move(command));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A word that names no subcommand would otherwise be reported as a missing subcommand.
    if (app.get_subcommands().empty())
      for (const std::string& word : app.remaining())
        if (!word.empty() && word[0] != '-') {
          std::vector<std::string> names;
          for (const CLI::App* command : app.get_subcommands({})) names.push_back(command->get_name());
          fmt::print(stderr, "loom: error: '{}' is not a loom command; the commands are {} (loom --help)\n",
                     word, fmt::join(names, ", "));
          return 1;
        }
    return app.exit(e);
  }
  try {
    configure_logging(log_level);
    for (const cli::Command& command : commands)
      if (*command.parsed) return command.run();
  } catch (const std::exception& e) {
    std::string message = e.what();
    // libtorch errors carry a backtrace after the first line; the reason is the first line.
    message = message.substr(0, message.find('\n'));
    fmt::print(stderr, "loom: error: {}\n", message);
    return 1;
  }
  return 0;
}
