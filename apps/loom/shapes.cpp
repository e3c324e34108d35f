// loom shapes: a model's parameter names, shapes and count, built without allocating it.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"

namespace loom::cli {

namespace {

// The model of a published name or of a model directory, of any family, as one process builds it.
int run_shapes(const std::string& what, bool list) {
  const models::NamedModel named = models::find_model(what);
  models::BuildOptions options;
  options.params.shapes_only = true;
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
  std::vector<std::string> published;
  for (const auto& family : models::families())
    published.insert(published.end(), family.presets.begin(), family.presets.end());
  command
      ->add_option("model", arguments->model,
                   fmt::format("Model directory, or published model name: {}", fmt::join(published, ", ")))
      ->required();
  command->add_flag("--names", arguments->list_names, "Print every parameter name and shape");
  return {command, [arguments] { return run_shapes(arguments->model, arguments->list_names); }};
}

}  // namespace loom::cli
