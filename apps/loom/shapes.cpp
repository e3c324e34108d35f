// loom shapes: a model's parameter names, shapes and count, built without allocating it.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "commands.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"

namespace loom::cli {

namespace {

// The model of a published name (qwen2-vl-7b, wan2.1-t2v-1.3b, ...) or of a model directory, of any
// family, as one process builds it.
int run_shapes(const std::string& what, bool list) {
  const models::NamedModel named = models::find_model(what);
  parallel::ParamOptions options;
  options.shapes_only = true;
  const auto model = named.family->build(named.hf, named.source, options);
  if (list)
    for (const auto& [name, p] : models::named_parameters(model->module()))
      fmt::print("{}\t[{}]\n", name, fmt::join(p.sizes(), ", "));
  fmt::print("{}: {} parameters\n", what, models::parameter_count(model->module()));
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
  command
      ->add_option("model", arguments->model,
                   "Published model name (e.g. qwen2-vl-7b, umt5-xxl) or model directory")
      ->required();
  command->add_flag("--names", arguments->list_names, "Print every parameter name and shape");
  return {command, [arguments] { return run_shapes(arguments->model, arguments->list_names); }};
}

}  // namespace loom::cli
