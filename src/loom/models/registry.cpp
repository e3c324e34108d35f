#include "loom/models/registry.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "loom/util/errors.h"

namespace loom::models {

std::vector<std::string> model_families() { return {"qwen2_vl", "qwen2_5_vl"}; }

Qwen2VLConfig model_config_from_json(const std::string& family, const nlohmann::json& hf,
                                     const std::string& source) {
  return parse_qwen2vl_config(hf, family, source);
}

Qwen2VLConfig model_config_from_file(const std::string& path, const std::string& family) {
  std::ifstream in(path);
  if (!in) throw ConfigError(fmt::format("{}: cannot open the model config", path));
  nlohmann::json hf;
  try {
    hf = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON ({})", path, e.what()));
  }
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

namespace {

// model.hf_config, or init_from's config.json without it.
Qwen2VLConfig configured_model_config(const config::JobConfig& job) {
  const auto& m = job.model;
  if (m.hf_config_path.empty() && m.hf_config.is_null()) {  // the config of init_from
    if (!std::filesystem::is_regular_file(m.init_from + "/config.json"))
      throw ConfigError(
          fmt::format("model.init_from: '{}' has no config.json to take the model's config from (or give "
                      "model.hf_config)",
                      m.init_from));
    return model_config_from_dir(m.init_from, m.family);
  }
  if (!m.hf_config_path.empty()) {
    const auto published = published_config_names();
    if (!std::filesystem::exists(m.hf_config_path) &&
        std::find(published.begin(), published.end(), m.hf_config_path) != published.end())
      return model_config_from_json(m.family, published_hf_config(m.hf_config_path),
                                    job.source + ": model.hf_config " + m.hf_config_path);
    if (!std::filesystem::is_regular_file(m.hf_config_path))
      throw ConfigError(fmt::format(
          "model.hf_config: '{}' is not a file (give a config.json path, inline fields or a published "
          "model: {})",
          m.hf_config_path, fmt::join(published, ", ")));
    return model_config_from_file(m.hf_config_path, m.family);
  }
  return model_config_from_json(m.family, m.hf_config, job.source + ": model.hf_config");
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
  config::validate_parallel(job,
                            {model.text.num_heads, model.text.num_kv_heads, model.vision.num_heads,
                             model.text.vocab_size, model.text.num_layers},
                            world_size);
}

}  // namespace loom::models
