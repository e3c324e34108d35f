// umT5 encoder (HuggingFace UMT5EncoderModel, Wan2.1's frozen text encoder) architecture settings,
// read from and written as HuggingFace config.json fields.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom::models {

struct UMT5Config {
  int64_t vocab_size = 256384;
  int64_t d_model = 4096;
  int64_t d_kv = 64;  // per-head width; num_heads * d_kv need not equal d_model
  int64_t d_ff = 10240;
  int64_t num_layers = 24;
  int64_t num_heads = 64;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  double layer_norm_epsilon = 1e-6;
  std::string feed_forward_proj = "gated-gelu";  // the only one Loom runs: wo(gelu_tanh(wi_0 x) * wi_1 x)
  int64_t pad_token_id = 0;
  int64_t eos_token_id = 1;
  nlohmann::json hf;  // the config.json this was read from (fields Loom does not use are kept on save)

  int64_t inner_dim() const { return num_heads * d_kv; }
};

// Reads a HuggingFace UMT5Config object. Missing optional fields take UMT5Config's defaults;
// model_type, when present, must be "umt5" (T5's "t5" shares layer 0's relative bias with every
// layer, other arithmetic). `source` names the file in errors.
UMT5Config parse_umt5_config(const nlohmann::json& hf, const std::string& source);

// Reads `<dir>/config.json`.
UMT5Config umt5_config_from_dir(const std::string& dir);

// The config.json object for the encoder (HF field names), starting from the fields it was read from.
nlohmann::json to_hf_config(const UMT5Config& config);

// Published configurations, for shapes-only listings: "umt5-xxl" (google/umt5-xxl, Wan2.1's text
// encoder: 5,680,910,336 encoder parameters).
nlohmann::json published_umt5_config(const std::string& name);
std::vector<std::string> published_umt5_config_names();

}  // namespace loom::models
