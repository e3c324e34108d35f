// Model families Loom can build, by the name used in `model.family`.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/model.h"
#include "loom/models/qwen2_vl/model.h"

namespace loom::models {

// A family of models Loom builds from a config.json: which config.json files are its own, the
// published configurations `loom shapes` knows by name, and the model built over ParamOptions
// (shapes_only: on the meta device, for listings). Each entry is the family's own code; this table
// is the one place that lists them.
struct ModelFamily {
  std::string name;  // as model.family names it
  std::function<bool(const nlohmann::json& hf)> owns;
  std::vector<std::string> published;
  std::function<nlohmann::json(const std::string& published_name)> published_config;
  // `source` names the config in errors.
  std::function<std::shared_ptr<core::Model>(const nlohmann::json& hf, const std::string& source,
                                             const parallel::ParamOptions& options)>
      build;
};

const std::vector<ModelFamily>& model_family_table();
std::vector<std::string> model_families();

// A model `loom shapes` or `loom forward` names: a published name (qwen2-vl-7b, umt5-xxl, ...) or a
// directory holding a config.json, with its config and family. ConfigError naming it and listing the
// published names (or the families) when it is neither, or no family owns its config.
struct NamedModel {
  const ModelFamily* family = nullptr;
  nlohmann::json hf;
  std::string source;  // the name, or the config.json's path
};
NamedModel find_model(const std::string& published_name_or_dir);

// The config.json object a job's model section names, and what names it in errors: model.hf_config
// (a path, a published name of model.family, or inline fields), else init_from's config.json.
struct NamedConfig {
  nlohmann::json hf;
  std::string source;
};
NamedConfig job_hf_config(const config::JobConfig& job);

// The architecture of a model from a HuggingFace config.json object; `source` names it in errors.
Qwen2VLConfig model_config_from_json(const std::string& family, const nlohmann::json& hf,
                                     const std::string& source);

// Reads a config.json file (family from its model_type when `family` is empty).
Qwen2VLConfig model_config_from_file(const std::string& path, const std::string& family = "");

// Reads `<dir>/config.json` (family from its model_type when `family` is empty).
Qwen2VLConfig model_config_from_dir(const std::string& dir, const std::string& family = "");

// Builds a model with uninitialised (or, shapes_only, unallocated) parameters, split over
// options.tp (the vision tower over `vision_tp` when given).
std::shared_ptr<Qwen2VLForConditionalGeneration> build_model(
    const Qwen2VLConfig& config, const parallel::ParamOptions& options,
    const std::optional<parallel::TensorParallelGroup>& vision_tp = std::nullopt);

// The model architecture a job asks for (model.hf_config as a path or inline fields, else
// init_from's config.json). When both are given, init_from's config.json must be valid and agree
// on every architecture field (ConfigError naming the field and both values).
Qwen2VLConfig job_model_config(const config::JobConfig& job);

// Checks the job's parallel layout against its model and `world_size` processes (validate_parallel):
// a one-line ConfigError before any work.
void validate_layout(const config::JobConfig& job, const Qwen2VLConfig& model, int64_t world_size);

}  // namespace loom::models
