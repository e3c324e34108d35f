#include "loom/models/qwen2_vl/spec.h"

#include <fmt/format.h>

#include "loom/data/image/qwen2vl_processor.h"
#include "loom/models/field_reader.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

Family qwen2_vl_family(const char* name) {
  Family family;
  family.name = name;
  family.kind = ModelKind::vision_language;
  family.owns = [name](const nlohmann::json& hf) { return model_type_is(hf, name); };
  for (const auto& published : published_config_names())
    if (published_hf_config(published)["model_type"] == name) family.presets.push_back(published);
  family.preset_config = published_hf_config;
  family.architecture = [name](const nlohmann::json& hf, const std::string& source) {
    return architecture_fields(parse_qwen2vl_config(hf, name, source));
  };
  family.check_layout = [name](const config::JobConfig& job, const nlohmann::json& hf,
                               const std::string& source, int64_t world_size) {
    validate_layout(job, parse_qwen2vl_config(hf, name, source), world_size);
  };
  family.build = [name](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    return std::static_pointer_cast<core::Model>(
        build_model(parse_qwen2vl_config(hf, name, source), options.params, options.vision_tp));
  };
  family.init = [](core::Model& model, uint64_t seed) { init_parameters(model.module(), seed); };
  family.load = [](core::Model& model, const std::string& dir) { load_parameters(model.module(), dir); };
  family.processor = [name](const nlohmann::json& hf, const std::string& source, const std::string& dir) {
    const Qwen2VLConfig config = parse_qwen2vl_config(hf, name, source);
    data::Qwen2VLImageOptions options;
    options.patch_size = config.vision.patch_size;
    options.temporal_patch_size = config.vision.temporal_patch_size;
    options.merge_size = config.vision.spatial_merge_size;
    if (!dir.empty()) options = data::read_qwen2vl_image_options(dir, options);
    return std::unique_ptr<data::ImageProcessor>(std::make_unique<data::Qwen2VLImageProcessor>(options));
  };
  return family;
}

}  // namespace

std::vector<Family> qwen2_vl_families() {
  return {qwen2_vl_family("qwen2_vl"), qwen2_vl_family("qwen2_5_vl")};
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

Qwen2VLConfig job_model_config(const config::JobConfig& job) {
  const NamedConfig named = checked_job_config(job);
  return parse_qwen2vl_config(named.hf, job.model.family, named.source);
}

void validate_layout(const config::JobConfig& job, const Qwen2VLConfig& model, int64_t world_size) {
  config::validate_parallel(
      job,
      {model.text.num_heads, model.text.num_kv_heads, model.vision.num_heads, model.text.vocab_size,
       model.text.num_layers, model.vision.depth + model.text.num_layers},
      world_size);
}

}  // namespace loom::models
