#include "loom/models/wan/vae_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>

#include "loom/models/field_reader.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

using json = nlohmann::json;

json as_json(const std::vector<bool>& values) {
  json out = json::array();
  for (bool v : values) out.push_back(v);
  return out;
}

}  // namespace

int64_t WanVaeConfig::temporal_factor() const {
  int64_t factor = 1;
  for (bool down : temperal_downsample)
    if (down) factor *= 2;
  return factor;
}

std::vector<double> wan21_latents_mean() {
  return {-0.7571, -0.7089, -0.9113, 0.1075,  -0.1745, 0.9653,  -0.1517, 1.5508,
          0.4134,  -0.0715, 0.5517,  -0.3632, -0.1922, -0.9497, 0.2503,  -0.2921};
}

std::vector<double> wan21_latents_std() {
  return {2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
          3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160};
}

WanVaeConfig parse_wan_vae_config(const json& config, const std::string& source) {
  if (!config.is_object()) throw ConfigError(source + ": a model config must be a JSON object");
  FieldReader r(config, source);
  const std::string class_name = r.string("_class_name", "WanVAE_");
  if (class_name == "AutoencoderKLWan")
    throw r.error("_class_name",
                  "diffusers' AutoencoderKLWan layout is not supported yet (valid: WanVAE_, Wan's own "
                  "parameter names)");
  if (class_name != "WanVAE_" && class_name != "WanVAE")
    throw r.error("_class_name", fmt::format("'{}' is not Wan's VAE (valid: WanVAE_)", class_name));

  WanVaeConfig c;
  c.hf = config;
  c.dim = r.integer("dim");
  c.z_dim = r.integer("z_dim");
  c.dim_mult = r.integers("dim_mult");
  c.num_res_blocks = r.integer("num_res_blocks");
  c.temperal_downsample = r.booleans("temperal_downsample");
  c.dropout = r.number("dropout", 0.0);
  c.attn_scales = r.numbers("attn_scales").value_or(std::vector<double>{});

  for (auto [key, value] :
       {std::pair{"dim", c.dim}, {"z_dim", c.z_dim}, {"num_res_blocks", c.num_res_blocks}})
    if (value <= 0) throw r.error(key, fmt::format("must be positive, got {}", value));
  // Upstream's decoder halves the input width of levels 1, 2 and 3 by hand (what the previous
  // upsampling left), so two to four levels build consistent shapes; a fifth would not.
  if (c.dim_mult.size() < 2 || c.dim_mult.size() > 4)
    throw r.error(
        "dim_mult",
        fmt::format("must have 2 to 4 levels (upstream's decoder is built for at most four), got [{}]",
                    fmt::join(c.dim_mult, ", ")));
  for (int64_t m : c.dim_mult)
    if (m <= 0)
      throw r.error("dim_mult", fmt::format("must be positive, got [{}]", fmt::join(c.dim_mult, ", ")));
  if (c.temperal_downsample.size() != c.dim_mult.size() - 1)
    throw r.error("temperal_downsample", fmt::format("needs one entry per level transition ({}), got {}",
                                                     c.dim_mult.size() - 1, c.temperal_downsample.size()));
  // Frame 0 is encoded alone, then chunks of 4 frames: 8x in time would need chunks of 8.
  if (c.temporal_factor() > 4)
    throw r.error("temperal_downsample",
                  "at most two levels may downsample time (the encoder reads chunks of 4 frames)");
  if (!c.attn_scales.empty())
    throw r.error("attn_scales",
                  fmt::format("must be empty, got [{}] (upstream's chunked encode cannot run attention "
                              "blocks between levels; Wan2.1 has none)",
                              fmt::join(c.attn_scales, ", ")));
  if (c.dropout != 0.0) throw r.error("dropout", fmt::format("only 0 is supported, got {}", c.dropout));

  auto mean = r.numbers("latents_mean"), deviation = r.numbers("latents_std");
  if (!mean && !deviation) {
    // Wan2.1's statistics are for its 16 channels; another VAE has none until they are given (encode
    // and decode do not need them; normalize_latents refuses).
    if (c.z_dim == 16) c.latents_mean = wan21_latents_mean(), c.latents_std = wan21_latents_std();
    return c;
  }
  for (auto [key, values] : {std::pair{"latents_mean", &mean}, {"latents_std", &deviation}}) {
    if (!*values)
      throw r.error(key, fmt::format("required with {} (the latent scale is both or neither)",
                                     key == std::string("latents_mean") ? "latents_std" : "latents_mean"));
    if (static_cast<int64_t>((*values)->size()) != c.z_dim)
      throw r.error(key, fmt::format("needs z_dim = {} values, got {}", c.z_dim, (*values)->size()));
  }
  for (double s : *deviation)
    if (!(s > 0)) throw r.error("latents_std", fmt::format("must be positive, got {}", s));
  c.latents_mean = *mean;
  c.latents_std = *deviation;
  return c;
}

WanVaeConfig wan_vae_config_from_dir(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return parse_wan_vae_config(read_config_file(path), path);
}

json to_hf_config(const WanVaeConfig& c) {
  json hf = c.hf.is_object() ? c.hf : json::object();
  hf["_class_name"] = "WanVAE_";
  hf["dim"] = c.dim;
  hf["z_dim"] = c.z_dim;
  hf["dim_mult"] = c.dim_mult;
  hf["num_res_blocks"] = c.num_res_blocks;
  hf["attn_scales"] = c.attn_scales;
  hf["temperal_downsample"] = as_json(c.temperal_downsample);
  hf["dropout"] = c.dropout;
  if (c.has_latent_scale()) {
    hf["latents_mean"] = c.latents_mean;
    hf["latents_std"] = c.latents_std;
  }
  if (!hf.contains("torch_dtype")) hf["torch_dtype"] = "float32";
  return hf;
}

std::vector<std::string> published_wan_vae_config_names() { return {"wan2.1-vae"}; }

json published_wan_vae_config(const std::string& name) {
  if (name == "wan2.1-vae")
    return {{"_class_name", "WanVAE_"},
            {"dim", 96},
            {"z_dim", 16},
            {"dim_mult", {1, 2, 4, 4}},
            {"num_res_blocks", 2},
            {"attn_scales", json::array()},
            {"temperal_downsample", {false, true, true}},
            {"dropout", 0.0},
            {"latents_mean", wan21_latents_mean()},
            {"latents_std", wan21_latents_std()}};
  throw ConfigError(fmt::format("unknown published model '{}' (valid: wan2.1-vae)", name));
}

}  // namespace loom::models
