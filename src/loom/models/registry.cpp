#include "loom/models/registry.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "loom/models/field_reader.h"
#include "loom/models/umt5/model.h"
#include "loom/models/wan/dit.h"
#include "loom/models/wan/vae.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

bool model_type_is(const nlohmann::json& hf, const char* type) {
  return hf.is_object() && hf.contains("model_type") && hf["model_type"] == type;
}

bool class_name_is(const nlohmann::json& hf, std::initializer_list<const char*> names) {
  if (!hf.is_object() || !hf.contains("_class_name") || !hf["_class_name"].is_string()) return false;
  const std::string name = hf["_class_name"].get<std::string>();
  return std::any_of(names.begin(), names.end(), [&name](const char* n) { return name == n; });
}

ModelFamily qwen2_vl_family(const char* name) {
  ModelFamily family;
  family.name = name;
  family.owns = [name](const nlohmann::json& hf) { return model_type_is(hf, name); };
  for (const auto& published : published_config_names())
    if (published_hf_config(published)["model_type"] == name) family.published.push_back(published);
  family.published_config = published_hf_config;
  family.build = [name](const nlohmann::json& hf, const std::string& source,
                        const parallel::ParamOptions& options) {
    return std::static_pointer_cast<core::Model>(
        build_model(parse_qwen2vl_config(hf, name, source), options));
  };
  return family;
}

}  // namespace

const std::vector<ModelFamily>& model_family_table() {
  static const std::vector<ModelFamily> table = [] {
    std::vector<ModelFamily> families = {qwen2_vl_family("qwen2_vl"), qwen2_vl_family("qwen2_5_vl")};
    ModelFamily umt5;
    umt5.name = "umt5";
    umt5.owns = [](const nlohmann::json& hf) { return model_type_is(hf, "umt5"); };
    umt5.published = published_umt5_config_names();
    umt5.published_config = published_umt5_config;
    umt5.build = [](const nlohmann::json& hf, const std::string& source,
                    const parallel::ParamOptions& options) {
      return std::static_pointer_cast<core::Model>(
          std::make_shared<UMT5EncoderModel>(parse_umt5_config(hf, source), options));
    };
    families.push_back(std::move(umt5));
    ModelFamily wan;
    wan.name = "wan";
    wan.owns = [](const nlohmann::json& hf) {
      return class_name_is(hf, {"WanModel", "WanTransformer3DModel"}) ||
             (model_type_is(hf, "t2v") && !hf.contains("_class_name"));
    };
    wan.published = published_wan_config_names();
    wan.published_config = published_wan_config;
    wan.build = [](const nlohmann::json& hf, const std::string& source,
                   const parallel::ParamOptions& options) {
      return std::static_pointer_cast<core::Model>(
          std::make_shared<WanModel>(parse_wan_config(hf, source), options));
    };
    families.push_back(std::move(wan));
    ModelFamily wan_vae;
    wan_vae.name = "wan_vae";
    wan_vae.owns = [](const nlohmann::json& hf) { return class_name_is(hf, {"WanVAE_", "WanVAE"}); };
    wan_vae.published = published_wan_vae_config_names();
    wan_vae.published_config = published_wan_vae_config;
    wan_vae.build = [](const nlohmann::json& hf, const std::string& source,
                       const parallel::ParamOptions& options) {
      return std::static_pointer_cast<core::Model>(
          std::make_shared<WanVAE>(parse_wan_vae_config(hf, source), options));
    };
    families.push_back(std::move(wan_vae));
    return families;
  }();
  return table;
}

std::vector<std::string> model_families() {
  std::vector<std::string> names;
  for (const auto& family : model_family_table()) names.push_back(family.name);
  return names;
}

NamedModel find_model(const std::string& what) {
  std::vector<std::string> published;
  for (const auto& family : model_family_table())
    for (const auto& name : family.published) {
      published.push_back(name);
      if (name == what && !std::filesystem::exists(what))
        return {&family, family.published_config(name), what};
    }
  if (!std::filesystem::is_directory(what))
    throw ConfigError(fmt::format("'{}' is neither a model directory nor a published model (valid: {})", what,
                                  fmt::join(published, ", ")));
  const std::string path = (std::filesystem::path(what) / "config.json").string();
  nlohmann::json hf = read_config_file(path);
  for (const auto& family : model_family_table())
    if (family.owns(hf)) return {&family, std::move(hf), path};
  throw ConfigError(
      fmt::format("{}: a config of no family Loom builds (families: {}; told apart by model_type "
                  "or _class_name)",
                  path, fmt::join(model_families(), ", ")));
}

Qwen2VLConfig model_config_from_json(const std::string& family, const nlohmann::json& hf,
                                     const std::string& source) {
  return parse_qwen2vl_config(hf, family, source);
}

Qwen2VLConfig model_config_from_file(const std::string& path, const std::string& family) {
  const nlohmann::json hf = read_config_file(path);
  std::string resolved = family;
  if (resolved.empty()) {
    if (!hf.contains("model_type") || !hf["model_type"].is_string())
      throw ConfigError(fmt::format("{}: model_type is missing; valid: qwen2_vl, qwen2_5_vl", path));
    resolved = hf["model_type"].get<std::string>();
  }
  return parse_qwen2vl_config(hf, resolved, path);
}

Qwen2VLConfig model_config_from_dir(const std::string& dir, const std::string& family) {
  return model_config_from_file(dir + "/config.json", family);
}

std::shared_ptr<Qwen2VLForConditionalGeneration> build_model(
    const Qwen2VLConfig& config, const parallel::ParamOptions& options,
    const std::optional<parallel::TensorParallelGroup>& vision_tp) {
  return std::make_shared<Qwen2VLForConditionalGeneration>(config, options, vision_tp);
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
    std::vector<std::string> published;
    for (const auto& family : model_family_table())
      if (family.name == m.family) published = family.published;
    if (!std::filesystem::exists(m.hf_config_path) &&
        std::find(published.begin(), published.end(), m.hf_config_path) != published.end())
      for (const auto& family : model_family_table())
        if (family.name == m.family)
          return {family.published_config(m.hf_config_path),
                  job.source + ": model.hf_config " + m.hf_config_path};
    if (!std::filesystem::is_regular_file(m.hf_config_path))
      throw ConfigError(fmt::format(
          "model.hf_config: '{}' is not a file (give a config.json path, inline fields or a published "
          "{} model: {})",
          m.hf_config_path, m.family, fmt::join(published, ", ")));
    return {read_config_file(m.hf_config_path), m.hf_config_path};
  }
  return {m.hf_config, job.source + ": model.hf_config"};
}

namespace {

// model.hf_config, or init_from's config.json without it.
Qwen2VLConfig configured_model_config(const config::JobConfig& job) {
  const NamedConfig named = job_hf_config(job);
  return parse_qwen2vl_config(named.hf, job.model.family, named.source);
}

// model.hf_config's architecture checked against init_from's own config.json, when it has one: the
// weights were trained for the latter.
void check_init_from_config(const config::ModelSection& m, const Qwen2VLConfig& config) {
  if (m.init_from.empty() || (m.hf_config_path.empty() && m.hf_config.is_null())) return;
  const std::string path = m.init_from + "/config.json";
  if (!std::filesystem::exists(path)) return;
  const Qwen2VLConfig given = model_config_from_file(path, m.family);
  const auto want = architecture_fields(config), have = architecture_fields(given);
  for (size_t i = 0; i < want.size(); ++i)
    if (want[i] != have[i])
      throw ConfigError(fmt::format(
          "model.hf_config disagrees with {} (the config of model.init_from's weights): {} is {} there and "
          "{} in model.hf_config; leave model.hf_config out to take init_from's",
          path, want[i].first, have[i].second, want[i].second));
}

}  // namespace

Qwen2VLConfig job_model_config(const config::JobConfig& job) {
  const Qwen2VLConfig config = configured_model_config(job);
  check_init_from_config(job.model, config);
  return config;
}

void validate_layout(const config::JobConfig& job, const Qwen2VLConfig& model, int64_t world_size) {
  config::validate_parallel(
      job,
      {model.text.num_heads, model.text.num_kv_heads, model.vision.num_heads, model.text.vocab_size,
       model.text.num_layers, model.vision.depth + model.text.num_layers},
      world_size);
}

}  // namespace loom::models
