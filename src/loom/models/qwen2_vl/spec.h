// The Qwen2-VL and Qwen2.5-VL families (models/family.h), and the typed entry points Qwen2-VL's own
// code and tests build them through.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/models/family.h"
#include "loom/models/qwen2_vl/model.h"

namespace loom::models {

std::vector<Family> qwen2_vl_families();

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

// The model architecture a job asks for (models/registry.h's checked_job_config, read as Qwen2-VL's).
Qwen2VLConfig job_model_config(const config::JobConfig& job);

// Checks the job's parallel layout against its model and `world_size` processes (validate_parallel):
// a one-line ConfigError before any work.
void validate_layout(const config::JobConfig& job, const Qwen2VLConfig& model, int64_t world_size);

}  // namespace loom::models
