#include "loom/models/wan/spec.h"

#include <fmt/format.h>

#include "loom/models/registry.h"
#include "loom/models/wan/dit.h"
#include "loom/models/wan/names.h"
#include "loom/models/wan/vae.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

// The Wan layouts: data parallelism, ZeRO-1 and FSDP for both; tensor parallelism for the DiT (over its
// heads and feed-forward, the residual stream whole: no sequence parallelism), and pipeline parallelism
// (its blocks cut into stages, the embeddings with the first and the head with the last). `tp_width` is what
// tp must divide besides the heads (the DiT's ffn_dim); 0: the model is whole on every rank.
void check_wan_layout(const config::JobConfig& job, const char* what, int64_t world_size, int64_t heads,
                      int64_t layers, int64_t tp_width) {
  const auto& p = job.parallel;
  const bool dit = tp_width > 0;
  if ((!dit && (p.tp != 1 || p.pp != 1 || p.cp != 1)) || p.ep != 1)
    throw ConfigError(fmt::format(
        "parallel: {} trains under data parallelism, ZeRO-1{} and FSDP only ({}ep 1{}); got tp {}, "
        "pp {}, cp {}, ep {}",
        what, dit ? ", tensor, pipeline and context parallelism" : "", dit ? "" : "pp, cp, ",
        dit ? "" : ", tp 1", p.tp, p.pp, p.cp, p.ep));
  if (p.dynamic_cp)
    throw ConfigError(
        fmt::format("parallel.dynamic_cp: {}'s samples all hold one number of tokens, so one degree fits "
                    "every step (remove it, and set parallel.cp)",
                    what));
  if (p.sequence_parallel)
    throw ConfigError(
        fmt::format("parallel.sequence_parallel: {} keeps whole sequences on every tensor-parallel "
                    "rank (remove it)",
                    what));
  if (p.vision_tp != 0)
    throw ConfigError(fmt::format("parallel.vision_tp: {} has no vision tower (remove it)", what));
  if (tp_width > 0 && tp_width % p.tp != 0)
    throw ConfigError(
        fmt::format("parallel.tp={} does not divide {}'s ffn_dim {} (each rank holds an equal "
                    "share of the feed-forward)",
                    p.tp, what, tp_width));
  config::validate_parallel(job, {heads, heads, heads, heads, layers}, world_size);
}

Family wan_dit_family() {
  Family wan;
  wan.name = "wan";
  wan.kind = ModelKind::denoiser;
  wan.owns = [](const nlohmann::json& hf) {
    return class_name_is(hf, {"WanModel", "WanTransformer3DModel"}) ||
           (model_type_is(hf, "t2v") && !hf.contains("_class_name"));
  };
  wan.presets = published_wan_config_names();
  wan.preset_config = published_wan_config;
  wan.check_layout = [](const config::JobConfig& job, const nlohmann::json& hf, const std::string& source,
                        int64_t world_size) {
    const WanConfig config = parse_wan_config(hf, source);
    check_wan_layout(job, "the Wan DiT", world_size, config.num_heads, config.num_layers, config.ffn_dim);
  };
  wan.build = [](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    return std::static_pointer_cast<core::Model>(
        std::make_shared<WanModel>(parse_wan_config(hf, source), options.params));
  };
  wan.init = [](core::Model& model, uint64_t seed) {
    init_wan_parameters(dynamic_cast<WanModel&>(model), seed);
  };
  wan.load = [](core::Model& model, const std::string& dir) {
    load_wan_parameters(dynamic_cast<WanModel&>(model), dir);
  };
  return wan;
}

Family wan_vae_family() {
  Family vae;
  vae.name = "wan_vae";
  vae.kind = ModelKind::latent_codec;
  vae.owns = [](const nlohmann::json& hf) { return class_name_is(hf, {"WanVAE_", "WanVAE"}); };
  vae.presets = published_wan_vae_config_names();
  vae.preset_config = published_wan_vae_config;
  vae.check_layout = [](const config::JobConfig& job, const nlohmann::json& hf, const std::string& source,
                        int64_t world_size) {
    parse_wan_vae_config(hf, source);
    check_wan_layout(job, "the Wan VAE", world_size, 1, 4, 0);
  };
  vae.build = [](const nlohmann::json& hf, const std::string& source, const BuildOptions& options) {
    return std::static_pointer_cast<core::Model>(
        std::make_shared<WanVAE>(parse_wan_vae_config(hf, source), options.params));
  };
  vae.init = [](core::Model& model, uint64_t seed) {
    init_wan_vae_parameters(dynamic_cast<WanVAE&>(model), seed);
  };
  vae.load = [](core::Model& model, const std::string& dir) { load_parameters(model.module(), dir); };
  return vae;
}

}  // namespace

std::vector<Family> wan_families() { return {wan_dit_family(), wan_vae_family()}; }

}  // namespace loom::models
