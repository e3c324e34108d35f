// Wan2.1 causal 3D VAE (WanVAE_) architecture settings and latent scale, read from and written as a
// config.json of Wan's constructor arguments plus diffusers' latents_mean / latents_std.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::models {

struct WanVaeConfig {
  int64_t dim = 96;                           // base width; level widths are dim * dim_mult
  int64_t z_dim = 16;                         // latent channels (the encoder head emits 2 * z_dim)
  std::vector<int64_t> dim_mult{1, 2, 4, 4};  // 2 to 4 levels, each after the first halving the sides
  int64_t num_res_blocks = 2;                 // per encoder level; the decoder has one more
  std::vector<double> attn_scales;            // always empty (see parse_wan_vae_config)
  std::vector<bool> temperal_downsample{false, true, true};  // per level transition (Wan's spelling);
                                                             // the decoder upsamples in reverse order
  double dropout = 0.0;                                      // always 0
  // Per-channel latent statistics: normalised = (mu - mean) / std. Not in the checkpoint. Empty when
  // the config gives none and z_dim is not Wan2.1's 16.
  std::vector<double> latents_mean, latents_std;  // (z_dim) each, or empty
  bool has_latent_scale() const { return !latents_mean.empty(); }
  nlohmann::json hf;  // the config.json this was read from (fields Loom does not use are kept on save)

  // 2^(levels that downsample time): 4 for Wan2.1.
  int64_t temporal_factor() const;
  // 2^(levels - 1): 8 for Wan2.1's four levels.
  int64_t spatial_factor() const { return int64_t{1} << (dim_mult.size() - 1); }
  // The encoder reads a clip as frame 0, then chunks of 4 frames (upstream's fixed chunking, also
  // for the full-sequence pass): of `frames`, it keeps the first 1 + 4 * ((frames - 1) / 4) and drops
  // the rest, as upstream does silently.
  static int64_t encoded_frames(int64_t frames) { return 1 + 4 * ((frames - 1) / 4); }
  int64_t latent_frames(int64_t frames) const { return 1 + (encoded_frames(frames) - 1) / temporal_factor(); }
  // Frames the decoder gives for `latent_frames`.
  int64_t video_frames(int64_t latent_frames) const { return 1 + temporal_factor() * (latent_frames - 1); }
};

// Wan2.1's latent statistics for z_dim 16 (WanVAE in wan/modules/vae.py), the defaults when a config
// gives none.
std::vector<double> wan21_latents_mean();
std::vector<double> wan21_latents_std();

// Reads a config object of WanVAE_'s constructor arguments (dim, z_dim, dim_mult, num_res_blocks,
// attn_scales, temperal_downsample, dropout; all required but dropout and attn_scales), plus optional
// latents_mean / latents_std (both or neither; neither: Wan2.1's statistics for z_dim 16, else none).
// `_class_name`, when present, must be WanVAE_ (or WanVAE): diffusers' AutoencoderKLWan layout is
// refused. Refused too, with one line naming `source` and the key: dim_mult of other than 2 to 4
// levels (upstream's decoder halves the input width of levels 1..3 by hand, what the upsampling
// before each left; a fifth level would not get its halving), a temperal_downsample of other than
// len(dim_mult) - 1 entries or with more than two true (a 4-frame chunk cannot be downsampled 8x in
// time), non-empty attn_scales (upstream's chunked encode cannot run attention
// between levels), dropout other than 0.
WanVaeConfig parse_wan_vae_config(const nlohmann::json& config, const std::string& source);

// Reads `<dir>/config.json`.
WanVaeConfig wan_vae_config_from_dir(const std::string& dir);

// The config.json object (Wan's keys, _class_name WanVAE_, latents_mean / latents_std), starting from
// the fields it was read from.
nlohmann::json to_hf_config(const WanVaeConfig& config);

// Published configurations, for shapes-only listings: "wan2.1-vae" (Wan2.1_VAE: 126,892,531
// parameters).
nlohmann::json published_wan_vae_config(const std::string& name);
std::vector<std::string> published_wan_vae_config_names();

}  // namespace loom::models
