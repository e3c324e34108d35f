#include "loom/models/qwen3_5/spec.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <random>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/qwen3_5/config.h"
#include "loom/models/qwen3_5/model.h"
#include "loom/models/qwen3_5/processor.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

using qwen3_5::Config;
using qwen3_5::ForConditionalGeneration;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// transformers' initialisation where it is not a draw from N(0, 0.02): the zero-centred norms start
// at 0 (a scale of one), the decay's A_log at log U(0.01, 16) and dt_bias at 1; each drawn from
// (seed, its name) as init_parameters draws.
void init_qwen3_5(core::Model& model, uint64_t seed) {
  init_parameters(model.module(), seed);
  at::NoGradGuard no_grad;
  for (auto& [name, param] : named_parameters(model.module())) {
    if (param.is_meta()) continue;
    const bool zero_centred = ends_with(name, "input_layernorm.weight") ||
                              ends_with(name, "post_attention_layernorm.weight") ||
                              name == "model.language_model.norm.weight" ||
                              ends_with(name, "q_norm.weight") || ends_with(name, "k_norm.weight");
    if (zero_centred || ends_with(name, "mlp.expert_bias")) {
      param.zero_();
    } else if (ends_with(name, "linear_attn.dt_bias")) {
      param.fill_(1.0);
    } else if (ends_with(name, "linear_attn.A_log")) {
      std::mt19937_64 draw(derive_seed(seed, name));
      std::uniform_real_distribution<double> uniform(0.01, 16.0);
      for (int64_t i = 0; i < param.numel(); ++i) param[i] = std::log(uniform(draw));
    }
  }
}

Family qwen3_5_family(const char* name) {
  Family family;
  family.name = name;
  family.kind = ModelKind::vision_language;
  family.owns = [name](const nlohmann::json& hf) { return model_type_is(hf, name); };
  family.presets = qwen3_5::published_names(name);
  family.preset_config = qwen3_5::published_config;
  family.architecture = [](const nlohmann::json& hf, const std::string& source) {
    return qwen3_5::architecture_fields(qwen3_5::parse_config(hf, source));
  };
  family.check_layout = [](const config::JobConfig& job, const nlohmann::json& hf, const std::string& source,
                           int64_t world_size) {
    const Config c = qwen3_5::parse_config(hf, source);
    const config::ParallelSection& p = job.parallel;
    if (p.cp_ulysses > 1)
      throw ConfigError(
          fmt::format("parallel.cp_ulysses={}: Qwen3.5's linear-attention layers pass their state along a "
                      "ring of ranks; this version of Loom runs its context parallelism as a ring only "
                      "(cp_ulysses 1)",
                      p.cp_ulysses));
    if (p.vision_tp > 1)
      throw ConfigError(fmt::format(
          "parallel.vision_tp={}: Qwen3.5's vision tower is whole on every tensor-parallel rank in "
          "this version of Loom; leave parallel.vision_tp unset or 1",
          p.vision_tp));
    if (c.text.linear.num_key_heads % p.tp != 0)
      throw ConfigError(fmt::format(
          "parallel.tp={} does not divide the linear-attention layers' {} key heads (linear_num_key_heads)",
          p.tp, c.text.linear.num_key_heads));
    config::JobConfig whole_tower = job;  // the vision tower's heads need not split
    whole_tower.parallel.vision_tp = 1;
    config::validate_parallel(
        whole_tower,
        {c.text.attention.num_heads, c.text.attention.num_kv_heads, c.vision.num_heads, c.text.vocab_size,
         static_cast<int64_t>(c.text.layer_types.size()),
         c.vision.depth + static_cast<int64_t>(c.text.layer_types.size()), c.text.num_experts},
        world_size);
  };
  family.build = [](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    if (options.vision_tp && options.vision_tp->size() > 1)
      throw ConfigError(
          "parallel.vision_tp: Qwen3.5's vision tower does not split over tensor-parallel ranks yet");
    Config config = qwen3_5::parse_config(hf, source);
    config.text.capacity_factor = options.moe_capacity_factor;
    config.text.z_loss = options.moe_z_loss;
    config.text.expert_bias_rate = options.moe_expert_bias_rate;
    return std::static_pointer_cast<core::Model>(
        std::make_shared<ForConditionalGeneration>(config, options.params));
  };
  family.init = init_qwen3_5;
  family.load = [](core::Model& model, const std::string& dir) {
    // The experts fused (as hub checkpoints and Loom store them), or one by one (as transformers'
    // save_pretrained writes them: mlp.experts.<e>.{gate,up,down}_proj.weight).
    const checkpoint::WeightSource source(dir);
    const int64_t experts = dynamic_cast<const ForConditionalGeneration&>(model).config.text.num_experts;
    const auto locate = [&source, experts](const std::string& parameter) {
      FileTensor at{parameter};
      // An expert bias is Loom's training state: a model trained without one starts at zero.
      at.optional = ends_with(parameter, "mlp.expert_bias");
      for (const char* fused : {"mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) {
        if (!ends_with(parameter, fused) || source.contains(parameter)) continue;
        const std::string base =
            parameter.substr(0, parameter.size() - std::string(fused).size()) + "mlp.experts.";
        const bool gate_up = ends_with(parameter, "gate_up_proj");
        for (int64_t e = 0; e < experts; ++e) {
          const std::string expert = base + std::to_string(e) + ".";
          at.stacked.push_back(
              gate_up ? std::vector<std::string>{expert + "gate_proj.weight", expert + "up_proj.weight"}
                      : std::vector<std::string>{expert + "down_proj.weight"});
        }
      }
      return at;
    };
    // Multi-token-prediction weights (mtp.*): Loom does not train MTP, so they are left unread, and said so.
    const int64_t skipped = load_parameters(
        model.module(), dir, locate, [](const std::string& tensor) { return tensor.rfind("mtp.", 0) == 0; });
    if (skipped > 0)
      spdlog::info(
          "{}: left {} multi-token-prediction tensors (mtp.*) unread: Loom does not train MTP, and "
          "its checkpoints will not carry them",
          dir, skipped);
  };
  family.processor = [](const nlohmann::json& hf, const std::string& source, const std::string& dir) {
    const Config c = qwen3_5::parse_config(hf, source);
    return std::unique_ptr<data::ImageProcessor>(
        std::make_unique<qwen3_5::ImageProcessor>(qwen3_5::image_options(c.vision, dir)));
  };
  return family;
}

}  // namespace

std::vector<Family> qwen3_5_families() { return {qwen3_5_family("qwen3_5"), qwen3_5_family("qwen3_5_moe")}; }

}  // namespace loom::models
