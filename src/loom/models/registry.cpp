#include "loom/models/registry.h"

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

}  // namespace loom::models
