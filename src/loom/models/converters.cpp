#include "loom/models/converters.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {

void FreezeModules::convert(core::Model& model) const {
  const auto named = named_parameters(model.module());
  for (const auto& prefix : prefixes_) {
    int64_t matched = 0;
    for (const auto& [name, param] : named)
      if (name == prefix || name.rfind(prefix + ".", 0) == 0) {
        param.set_requires_grad(false);
        ++matched;
      }
    if (matched == 0)
      throw ConfigError(fmt::format("model.freeze: '{}' matches no parameter (e.g. {})", prefix,
                                    fmt::join(model.freeze_examples(), ", ")));
  }
  for (const auto& [name, param] : named)
    if (param.requires_grad()) return;
  throw ConfigError("model.freeze: every parameter is frozen; nothing would train");
}

std::vector<std::unique_ptr<ModelConverter>> model_converters(const config::JobConfig& job) {
  std::vector<std::unique_ptr<ModelConverter>> converters;
  if (!job.model.freeze.empty()) converters.push_back(std::make_unique<FreezeModules>(job.model.freeze));
  return converters;
}

void convert_model(core::Model& model, const config::JobConfig& job) {
  for (const auto& converter : model_converters(job)) converter->convert(model);
}

}  // namespace loom::models
