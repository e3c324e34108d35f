// loom shapes: a model's parameter names, shapes and count, built without allocating it.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::cli {

namespace {

// The model of a published name (qwen2-vl-7b, ...) or of a model directory, as one process builds it.
int run_shapes(const std::string& what, bool list) {
  models::Qwen2VLConfig config;
  const auto published = models::published_config_names();
  if (std::find(published.begin(), published.end(), what) != published.end()) {
    auto hf = models::published_hf_config(what);
    config = models::model_config_from_json(hf["model_type"].get<std::string>(), hf, what);
  } else if (std::filesystem::is_directory(what)) {
    config = models::model_config_from_dir(what);
  } else {
    throw ConfigError(fmt::format("'{}' is neither a model directory nor a published model (valid: {})", what,
                                  fmt::join(published, ", ")));
  }
  parallel::ParamOptions options;
  options.shapes_only = true;
  auto model = models::build_model(config, options);
  if (list)
    for (const auto& [name, p] : models::named_parameters(*model))
      fmt::print("{}\t[{}]\n", name, fmt::join(p.sizes(), ", "));
  fmt::print("{}: {} parameters\n", what, models::parameter_count(*model));
  return 0;
}

}  // namespace

Command add_shapes(CLI::App& loom) {
  struct Arguments {
    std::string model;
    bool list_names = false;
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command =
      loom.add_subcommand("shapes", "List a model's parameter names, shapes and count without allocating");
  command->add_option("model", arguments->model, "Published model name (e.g. qwen2-vl-7b) or model directory")
      ->required();
  command->add_flag("--names", arguments->list_names, "Print every parameter name and shape");
  return {command, [arguments] { return run_shapes(arguments->model, arguments->list_names); }};
}

}  // namespace loom::cli
