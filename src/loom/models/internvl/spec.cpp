#include "loom/models/internvl/spec.h"

#include <fmt/format.h>

#include "loom/models/field_reader.h"
#include "loom/models/internvl/config.h"
#include "loom/models/internvl/model.h"
#include "loom/models/internvl/names.h"
#include "loom/models/internvl/processor.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

// The processor of a model directory (its image processor settings, data::read_image_processor_settings),
// over the model's tile geometry.
InternVLImageOptions image_options(const InternVLConfig& config, const std::string& dir) {
  InternVLImageOptions options;
  options.tile_size = config.vision.image_size;
  options.patch_size = config.vision.patch_size;
  options.tokens_per_tile = config.projector.tokens_per_tile(config.vision);
  if (dir.empty()) return options;
  const data::ImageProcessorSettings read = data::read_image_processor_settings(dir);
  if (read.settings.is_null()) return options;
  const nlohmann::json& settings = read.settings;
  const std::string& path = read.path;
  const FieldReader f(settings, path);
  options.min_tiles = f.integer("min_patches", options.min_tiles);
  options.max_tiles = f.integer("max_patches", options.max_tiles);
  if (f.has("image_mean"))
    for (size_t i = 0; i < 3; ++i)
      options.mean[i] = static_cast<float>(settings["image_mean"].at(i).get<double>());
  if (f.has("image_std"))
    for (size_t i = 0; i < 3; ++i)
      options.std[i] = static_cast<float>(settings["image_std"].at(i).get<double>());
  if (f.has("size")) {
    const FieldReader size(settings["size"], path, "size.");
    if (size.integer("height") != options.tile_size || size.integer("width") != options.tile_size)
      throw size.error("height", fmt::format("the tiles must be the vision tower's {}x{}", options.tile_size,
                                             options.tile_size));
  }
  return options;
}

}  // namespace

std::vector<Family> internvl_families() {
  Family family;
  family.name = "internvl";
  family.kind = ModelKind::vision_language;
  family.owns = [](const nlohmann::json& hf) { return model_type_is(hf, "internvl"); };
  family.presets = internvl_published_names();
  family.preset_config = internvl_published_config;
  family.architecture = [](const nlohmann::json& hf, const std::string& source) {
    return internvl_architecture_fields(parse_internvl_config(hf, source));
  };
  family.check_layout = [](const config::JobConfig& job, const nlohmann::json& hf, const std::string& source,
                           int64_t world_size) {
    const InternVLConfig c = parse_internvl_config(hf, source);
    const TextConfig& t = c.text();
    config::validate_parallel(job,
                              {t.num_heads, t.num_kv_heads, c.vision.num_attention_heads, t.vocab_size,
                               t.num_layers, c.vision.num_hidden_layers + t.num_layers},
                              world_size);
  };
  family.build = [](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    return std::static_pointer_cast<core::Model>(std::make_shared<InternVLForConditionalGeneration>(
        parse_internvl_config(hf, source), options.params, options.vision_tp));
  };
  family.init = [](core::Model& model, uint64_t seed) {
    init_parameters(model.module(), seed);
    // Layer scales start at layer_scale_init_value, as transformers initialises them.
    const auto& internvl = dynamic_cast<const InternVLForConditionalGeneration&>(model);
    at::NoGradGuard no_grad;
    for (const auto& layer : internvl.vision_tower->layers)
      for (at::Tensor* scale : {&layer->lambda_1, &layer->lambda_2})
        if (!scale->is_meta()) scale->fill_(internvl.config.vision.layer_scale_init_value);
  };
  family.load = [](core::Model& model, const std::string& dir) {
    const auto& internvl = dynamic_cast<const InternVLForConditionalGeneration&>(model);
    load_internvl_parameters(model.module(), dir, internvl.config.vision.hidden_size);
  };
  family.processor = [](const nlohmann::json& hf, const std::string& source, const std::string& dir) {
    return std::unique_ptr<data::ImageProcessor>(
        std::make_unique<InternVLImageProcessor>(image_options(parse_internvl_config(hf, source), dir)));
  };
  return {family};
}

}  // namespace loom::models
