#include "loom/models/umt5/spec.h"

#include "loom/models/registry.h"
#include "loom/models/umt5/model.h"
#include "loom/models/weights.h"

namespace loom::models {

std::vector<Family> umt5_families() {
  Family umt5;
  umt5.name = "umt5";
  umt5.kind = ModelKind::text_encoder;
  umt5.owns = [](const nlohmann::json& hf) { return model_type_is(hf, "umt5"); };
  umt5.presets = published_umt5_config_names();
  umt5.preset_config = published_umt5_config;
  umt5.build = [](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    return std::static_pointer_cast<core::Model>(
        std::make_shared<UMT5EncoderModel>(parse_umt5_config(hf, source), options.params));
  };
  umt5.init = [](core::Model& model, uint64_t seed) {
    init_umt5_parameters(dynamic_cast<UMT5EncoderModel&>(model), seed);
  };
  umt5.load = [](core::Model& model, const std::string& dir) { load_parameters(model.module(), dir); };
  return {umt5};
}

}  // namespace loom::models
