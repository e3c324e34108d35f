// The model families Loom builds (models/family.h), by the name model.family gives them, and what a
// job, `loom shapes` or `loom forward` asks of them: the family and the config.json of a model, checked
// and built under a layout.
#pragma once
#include <initializer_list>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/model.h"
#include "loom/models/family.h"
#include "loom/parallel/context/shard.h"

namespace loom::models {

// Every registered family (models/families.inc), in registration order.
const std::vector<Family>& families();
std::vector<std::string> family_names();
// The family model.family names: ConfigError "model.family: 'x' is not one of ..." otherwise.
const Family& family_named(const std::string& name);
// The families of one kind, by name.
std::vector<std::string> family_names(ModelKind kind);

// For families' `owns`: config.json's model_type is `type`; its _class_name is one of `names`.
bool model_type_is(const nlohmann::json& hf, const char* type);
bool class_name_is(const nlohmann::json& hf, std::initializer_list<const char*> names);

// The image processor of a vision-language model of `family` and `hf` (Family::processor), with the
// settings of `dir`'s processor files when it is not empty. ConfigError for a family without one.
std::unique_ptr<data::ImageProcessor> make_processor(const std::string& family, const nlohmann::json& hf,
                                                     const std::string& source, const std::string& dir = "");

// A model `loom shapes` or `loom forward` names: a published name (qwen2-vl-7b, umt5-xxl, ...) or a
// directory holding a config.json, with its config and family. ConfigError naming it and listing the
// published names (or the families) when it is neither, or no family owns its config.
struct NamedModel {
  const Family* family = nullptr;
  nlohmann::json hf;
  std::string source;  // the name, or the config.json's path
};
NamedModel find_model(const std::string& published_name_or_dir);

// The model of a directory find_model named, built under `options` and loaded from the directory.
std::shared_ptr<core::Model> load_model(const NamedModel& named, const std::string& dir,
                                        const BuildOptions& options = {});

// A frozen model of `kind` that a job names beside its own (a denoiser's latent codec, model.vae, and
// text encoder, model.text_encoder): a model directory's (`dir`), loaded from it, or an inline
// config's, its weights drawn from `seed` (Family::init). The family is the one of `kind` that owns
// the config, else the only family of that kind. ConfigError naming `key` when no family of `kind`
// reads it. Returned in eval mode without gradients, on the CPU, in float32.
std::shared_ptr<core::Model> load_frozen_model(ModelKind kind, const std::string& key, const std::string& dir,
                                               const nlohmann::json& inline_config, uint64_t seed);

// `model` as the interface of its kind (vision_language.h, generator.h): ModelError naming `what`
// when its family's model does not implement it.
[[noreturn]] void throw_not_interface(const std::string& what);
template <typename Interface>
std::shared_ptr<Interface> as_interface(std::shared_ptr<core::Model> model, const std::string& what) {
  auto typed = std::dynamic_pointer_cast<Interface>(std::move(model));
  if (!typed) throw_not_interface(what);
  return typed;
}

// The config.json object a job's model section names, and what names it in errors: model.hf_config
// (a path, a published name of model.family, or inline fields), else init_from's config.json.
struct NamedConfig {
  nlohmann::json hf;
  std::string source;
};
NamedConfig job_hf_config(const config::JobConfig& job);

// job_hf_config, checked against init_from's config.json when both are given: that must be valid and
// agree on every architecture field of the family (ConfigError naming the field and both values).
NamedConfig checked_job_config(const config::JobConfig& job);

// The job's parallel layout checked against its model and `world_size` processes, by the family: a
// one-line ConfigError before any work. Returns the checked config (checked_job_config).
NamedConfig check_job_layout(const config::JobConfig& job, int64_t world_size);

// The job's model whole, as one process builds it from its config (job_hf_config): unallocated
// (shapes only), or loaded from the model directory `dir` (e.g. a checkpoint of the job) in float32.
std::shared_ptr<core::Model> job_model_shapes(const config::JobConfig& job);
std::shared_ptr<core::Model> load_job_model(const config::JobConfig& job, const std::string& dir);

// The job's model from its checked config over `layout`: built as the family splits it under the
// job's parallel section (`cp`: the job's context-parallel groups, formed once per job), initialised
// from training.seed, loaded from model.init_from when given, and moved to the layout's device
// (initialised on the CPU, so every device holds the same weights).
std::shared_ptr<core::Model> build_job_model(const config::JobConfig& job, const NamedConfig& named,
                                             const core::Layout& layout,
                                             const parallel::ContextParallelGroup& cp);

}  // namespace loom::models
