#include "loom/models/registry.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "loom/models/field_reader.h"
#include "loom/parallel/context/shard.h"
#include "loom/util/errors.h"

namespace loom::models {

#define LOOM_FAMILY_FOLDER(folder) std::vector<Family> folder##_families();
#include "loom/models/families.inc"
#undef LOOM_FAMILY_FOLDER

const char* kind_name(ModelKind kind) {
  switch (kind) {
    case ModelKind::vision_language:
      return "vision-language model";
    case ModelKind::denoiser:
      return "denoiser";
    case ModelKind::latent_codec:
      return "latent codec";
    case ModelKind::text_encoder:
      return "text encoder";
  }
  return "model";
}

bool model_type_is(const nlohmann::json& hf, const char* type) {
  return hf.is_object() && hf.contains("model_type") && hf["model_type"] == type;
}

bool class_name_is(const nlohmann::json& hf, std::initializer_list<const char*> names) {
  if (!hf.is_object() || !hf.contains("_class_name") || !hf["_class_name"].is_string()) return false;
  const std::string name = hf["_class_name"].get<std::string>();
  return std::any_of(names.begin(), names.end(), [&name](const char* n) { return name == n; });
}

const std::vector<Family>& families() {
  static const std::vector<Family> table = [] {
    std::vector<Family> all;
    const auto add = [&all](std::vector<Family> folder) {
      for (auto& family : folder) all.push_back(std::move(family));
    };
#define LOOM_FAMILY_FOLDER(folder) add(folder##_families());
#include "loom/models/families.inc"
#undef LOOM_FAMILY_FOLDER
    return all;
  }();
  return table;
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const auto& family : families()) names.push_back(family.name);
  return names;
}

std::vector<std::string> family_names(ModelKind kind) {
  std::vector<std::string> names;
  for (const auto& family : families())
    if (family.kind == kind) names.push_back(family.name);
  return names;
}

const Family& family_named(const std::string& name) {
  for (const auto& family : families())
    if (family.name == name) return family;
  throw ConfigError(
      fmt::format("model.family: '{}' is not one of {}", name, fmt::join(family_names(), ", ")));
}

std::unique_ptr<data::ImageProcessor> make_processor(const std::string& family, const nlohmann::json& hf,
                                                     const std::string& source, const std::string& dir) {
  const Family& f = family_named(family);
  if (!f.processor)
    throw ConfigError(
        fmt::format("model.family: {} models ({}s) have no image processor", f.name, kind_name(f.kind)));
  return f.processor(hf, source, dir);
}

std::shared_ptr<core::Model> load_model(const NamedModel& named, const std::string& dir,
                                        const BuildOptions& options) {
  std::shared_ptr<core::Model> model = named.family->build(named.hf, named.source, options);
  named.family->load(*model, dir);
  return model;
}

std::shared_ptr<core::Model> load_frozen_model(ModelKind kind, const std::string& key, const std::string& dir,
                                               const nlohmann::json& inline_config, uint64_t seed) {
  const std::string source = dir.empty() ? key : (std::filesystem::path(dir) / "config.json").string();
  const nlohmann::json hf = dir.empty() ? inline_config : read_config_file(source);
  const std::vector<std::string> names = family_names(kind);
  const Family* family = nullptr;
  for (const auto& f : families())
    if (f.kind == kind && f.owns(hf)) family = &f;
  if (!family && names.size() == 1) family = &family_named(names[0]);
  if (!family)
    throw ConfigError(
        fmt::format("{}: {} is not the config of a {} Loom builds ({}; told apart by "
                    "model_type or _class_name)",
                    key, source, kind_name(kind), fmt::join(names, ", ")));
  std::shared_ptr<core::Model> model = family->build(hf, source, {});
  if (dir.empty())
    family->init(*model, seed);
  else
    family->load(*model, dir);
  model->module().eval();
  for (auto& p : model->module().parameters()) p.set_requires_grad(false);
  return model;
}

std::shared_ptr<core::Model> job_model_shapes(const config::JobConfig& job) {
  const NamedConfig named = job_hf_config(job);
  BuildOptions options;
  options.params.shapes_only = true;
  return family_named(job.model.family).build(named.hf, named.source, options);
}

std::shared_ptr<core::Model> load_job_model(const config::JobConfig& job, const std::string& dir) {
  const NamedConfig named = job_hf_config(job);
  const Family& family = family_named(job.model.family);
  std::shared_ptr<core::Model> model = family.build(named.hf, named.source, {});
  family.load(*model, dir);
  return model;
}

void throw_not_interface(const std::string& what) {
  throw ModelError(fmt::format("{}: its family's model does not implement its kind's interface", what));
}

NamedModel find_model(const std::string& what) {
  std::vector<std::string> published;
  for (const auto& family : families())
    for (const auto& name : family.presets) {
      published.push_back(name);
      if (name == what && !std::filesystem::exists(what)) return {&family, family.preset_config(name), what};
    }
  if (!std::filesystem::is_directory(what))
    throw ConfigError(fmt::format("'{}' is neither a model directory nor a published model (valid: {})", what,
                                  fmt::join(published, ", ")));
  const std::string path = (std::filesystem::path(what) / "config.json").string();
  nlohmann::json hf = read_config_file(path);
  for (const auto& family : families())
    if (family.owns(hf)) return {&family, std::move(hf), path};
  throw ConfigError(
      fmt::format("{}: a config of no family Loom builds (families: {}; told apart by model_type "
                  "or _class_name)",
                  path, fmt::join(family_names(), ", ")));
}

NamedConfig job_hf_config(const config::JobConfig& job) {
  const auto& m = job.model;
  if (m.hf_config_path.empty() && m.hf_config.is_null()) {  // the config of init_from
    const std::string path = m.init_from + "/config.json";
    if (!std::filesystem::is_regular_file(path))
      throw ConfigError(
          fmt::format("model.init_from: '{}' has no config.json to take the model's config from (or give "
                      "model.hf_config)",
                      m.init_from));
    return {read_config_file(path), path};
  }
  if (!m.hf_config_path.empty()) {
    const Family& family = family_named(m.family);
    const auto& published = family.presets;
    if (!std::filesystem::exists(m.hf_config_path) &&
        std::find(published.begin(), published.end(), m.hf_config_path) != published.end())
      return {family.preset_config(m.hf_config_path), job.source + ": model.hf_config " + m.hf_config_path};
    if (!std::filesystem::is_regular_file(m.hf_config_path))
      throw ConfigError(fmt::format(
          "model.hf_config: '{}' is not a file (give a config.json path, inline fields or a published "
          "{} model: {})",
          m.hf_config_path, m.family, fmt::join(published, ", ")));
    return {read_config_file(m.hf_config_path), m.hf_config_path};
  }
  return {m.hf_config, job.source + ": model.hf_config"};
}

NamedConfig checked_job_config(const config::JobConfig& job) {
  const auto& m = job.model;
  NamedConfig named = job_hf_config(job);
  const Family& family = family_named(m.family);
  // model.hf_config's architecture checked against init_from's own config.json, when it has one: the
  // weights were trained for the latter.
  if (!family.architecture || m.init_from.empty() || (m.hf_config_path.empty() && m.hf_config.is_null()))
    return named;
  const std::string path = m.init_from + "/config.json";
  if (!std::filesystem::exists(path)) return named;
  const auto want = family.architecture(named.hf, named.source);
  const auto have = family.architecture(read_config_file(path), path);
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != have[i])
      throw ConfigError(fmt::format(
          "model.hf_config disagrees with {} (the config of model.init_from's weights): {} is {} there and "
          "{} in model.hf_config; leave model.hf_config out to take init_from's",
          path, want[i].first, have[i].second, want[i].second));
  return named;
}

NamedConfig check_job_layout(const config::JobConfig& job, int64_t world_size) {
  const Family& family = family_named(job.model.family);
  if (!family.check_layout)
    throw ConfigError(fmt::format("model.family: {} models ({}s) are not trained by any task", family.name,
                                  kind_name(family.kind)));
  NamedConfig named = checked_job_config(job);
  family.check_layout(job, named.hf, named.source, world_size);
  return named;
}

std::shared_ptr<core::Model> build_job_model(const config::JobConfig& job, const NamedConfig& named,
                                             const core::Layout& layout,
                                             const parallel::ContextParallelGroup& cp) {
  const Family& family = family_named(job.model.family);
  BuildOptions options;
  options.params.dtype = job.training.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  options.params.tp = {layout.tp(), job.parallel.sequence_parallel};
  options.params.cp = cp;
  options.params.ep = layout.parallel->ep();
  options.params.replicate_above = job.parallel.hot_expert_threshold;
  if (job.parallel.vision_tp == 1) options.vision_tp = parallel::TensorParallelGroup{};
  options.moe_capacity_factor = job.training.moe_capacity_factor;
  options.moe_z_loss = job.training.moe_z_loss;
  options.moe_expert_bias_rate = job.training.moe_expert_bias_rate;
  std::shared_ptr<core::Model> model = family.build(named.hf, named.source, options);
  family.init(*model, static_cast<uint64_t>(job.training.seed));
  if (!job.model.init_from.empty()) family.load(*model, job.model.init_from);
  model->module().to(layout.device);  // initialised on the CPU: the same weights on every device
  return model;
}

}  // namespace loom::models
