// Wan2.1 text-to-video DiT architecture settings, read from a config.json with Wan's own keys
// (WanModel: dim, num_heads, ...) or diffusers' (WanTransformer3DModel: num_attention_heads,
// attention_head_dim, ...), and written with Wan's keys.
#pragma once
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::models {

struct WanConfig {
  std::string model_type = "t2v";              // the only one Loom runs (i2v / flf2v / vace add image inputs)
  std::array<int64_t, 3> patch_size{1, 2, 2};  // (pt, ph, pw)
  int64_t text_len = 512;  // text rows the cross-attention sees: each prompt zero-padded to this many
  int64_t in_dim = 16;     // latent channels in
  int64_t dim = 1536;      // C, the width of the residual stream
  int64_t ffn_dim = 8960;
  int64_t freq_dim = 256;   // width of the timestep sinusoid
  int64_t text_dim = 4096;  // width of the text features (umT5-XXL)
  int64_t out_dim = 16;     // latent channels out
  int64_t num_heads = 12;
  int64_t num_layers = 30;
  std::array<int64_t, 2> window_size{-1, -1};  // (-1, -1): global attention, the only kind supported
  bool qk_norm = true;                         // RMSNorm over all C of q and k (norm_q, norm_k)
  bool cross_attn_norm = true;                 // norm3: LayerNorm with affine before the cross-attention
  double eps = 1e-6;
  int64_t rope_max_positions = 1024;  // rotary table size: frame, row and column indexes below this
  nlohmann::json hf;  // the config.json this was read from (Wan keys: fields Loom does not use are kept)

  int64_t head_dim() const { return dim / num_heads; }
  int64_t patch_volume() const { return patch_size[0] * patch_size[1] * patch_size[2]; }
  // Width of one latent patch as the patch embedding reads it: C_in * pt * ph * pw.
  int64_t patch_in_width() const { return in_dim * patch_volume(); }
  // Width of one output token before unpatchifying: pt * ph * pw * C_out.
  int64_t patch_out_width() const { return patch_volume() * out_dim; }
};

// Reads a config.json object with Wan keys or, when `_class_name` is WanTransformer3DModel (or the
// object has attention_head_dim and no dim), diffusers keys. diffusers configs carry no text_len:
// it is 512 (what WanPipeline pads prompts to) unless the object has a `text_len` key. Errors are
// one-line ConfigErrors naming `source` and the key.
WanConfig parse_wan_config(const nlohmann::json& hf, const std::string& source);

// Reads `<dir>/config.json`.
WanConfig wan_config_from_dir(const std::string& dir);

// The config.json object with Wan's keys (_class_name WanModel), keeping the other fields of a Wan
// config it was read from (a diffusers one is not kept: its keys would name the other layout).
nlohmann::json to_hf_config(const WanConfig& config);

// Published configurations, for shapes-only listings: "wan2.1-t2v-1.3b" (1,418,996,800 parameters)
// and "wan2.1-t2v-14b" (14,288,491,584).
nlohmann::json published_wan_config(const std::string& name);
std::vector<std::string> published_wan_config_names();

}  // namespace loom::models
