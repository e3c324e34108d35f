// A model family: everything Loom knows of one architecture, written once in the family's folder
// (models/<folder>/spec.cpp) and registered there in one line of models/families.inc. Config, data,
// tasks, train and apps ask the registry (models/registry.h) and the kind's interface; none of them
// names a family.
#pragma once
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/model.h"
#include "loom/data/image/processor.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// What a family's models are: the interface tasks and commands are written against.
enum class ModelKind {
  vision_language,  // a vision encoder, a projector and a language model (vlm_sft)
  denoiser,         // a diffusion model over latents, conditioned on text (flow_matching)
  latent_codec,     // a VAE between pixels and latents (vae)
  text_encoder,     // text to the features a denoiser reads
};
const char* kind_name(ModelKind kind);

// What a model is built over.
struct BuildOptions {
  parallel::ParamOptions params;  // dtype, shapes_only, the tensor- and context-parallel groups
  // A vision-language model's vision tower over a group of its own (parallel.vision_tp: 1 keeps it
  // whole); nullopt: over params.tp like the language model.
  std::optional<parallel::TensorParallelGroup> vision_tp;
  // A mixture of experts' routing as the job asks (training.moe_capacity_factor, moe_z_loss,
  // moe_expert_bias_rate; 0: off). Refused for a model without experts (config::validate_parallel).
  double moe_capacity_factor = 0.0, moe_z_loss = 0.0, moe_expert_bias_rate = 0.0;
};

struct Family {
  std::string name;  // as model.family names it
  ModelKind kind = ModelKind::vision_language;
  // Whether a config.json is this family's (its model_type, _class_name or architectures).
  std::function<bool(const nlohmann::json& hf)> owns;
  // The published configurations `loom shapes` and model.hf_config know by name.
  std::vector<std::string> presets;
  std::function<nlohmann::json(const std::string& preset)> preset_config;
  // The fields that fix the architecture, as (name, value) text: a model.hf_config given beside
  // model.init_from must agree with init_from's config.json on each. ConfigError naming `source` for
  // a config that is not valid.
  std::function<std::vector<std::pair<std::string, std::string>>(const nlohmann::json& hf,
                                                                 const std::string& source)>
      architecture;
  // Checks a job's parallel layout against the model of `hf` and `world_size` processes: a one-line
  // ConfigError naming the key and why the family refuses it (the layouts it supports are those it
  // lets through).
  std::function<void(const config::JobConfig& job, const nlohmann::json& hf, const std::string& source,
                     int64_t world_size)>
      check_layout;
  // The model with uninitialised parameters (unallocated under params.shapes_only), split as the
  // options say.
  std::function<std::shared_ptr<core::Model>(const nlohmann::json& hf, const std::string& source,
                                             const BuildOptions& options)>
      build;
  // Every parameter drawn from (seed, its name), whatever the layout.
  std::function<void(core::Model& model, uint64_t seed)> init;
  // The weights of a model directory (config.json + safetensors), under the family's HF names or
  // those of another published layout it maps.
  std::function<void(core::Model& model, const std::string& dir)> load;
  // Vision-language families: the image processor of a model of `hf`, with the settings of a model
  // directory's processor files when `dir` is not empty (its defaults otherwise). Null for the
  // other kinds.
  std::function<std::unique_ptr<data::ImageProcessor>(const nlohmann::json& hf, const std::string& source,
                                                      const std::string& dir)>
      processor;
};

}  // namespace loom::models
