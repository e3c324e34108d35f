// Qwen2-VL and Qwen2.5-VL architecture settings, read from and written as HuggingFace
// config.json fields.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/models/text/config.h"

namespace loom::models {

enum class VisionFamily { qwen2_vl, qwen2_5_vl };

struct VisionConfig {
  VisionFamily family = VisionFamily::qwen2_vl;
  int64_t depth = 32;
  int64_t width = 1280;  // ViT width: embed_dim (Qwen2-VL) or hidden_size (Qwen2.5-VL)
  int64_t num_heads = 16;
  int64_t mlp_hidden = 5120;  // embed_dim * mlp_ratio (Qwen2-VL) or intermediate_size (Qwen2.5-VL)
  int64_t out_width = 3584;   // LLM width the merger projects to
  int64_t in_channels = 3;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t spatial_merge_size = 2;
  std::string hidden_act = "quick_gelu";
  // Qwen2.5-VL window attention.
  int64_t window_size = 112;
  std::vector<int64_t> fullatt_block_indexes;
  double tokens_per_second =
      4.0;  // Qwen2.5-VL: temporal positions a second of video (4: transformers' default)

  int64_t head_dim() const { return width / num_heads; }
  int64_t patch_row_width() const { return in_channels * temporal_patch_size * patch_size * patch_size; }
  int64_t merged_width() const { return width * spatial_merge_size * spatial_merge_size; }
};

struct TokenIds {
  int64_t image = 151655, video = 151656, vision_start = 151652, vision_end = 151653;
  int64_t bos = 151643, eos = 151645;
};

struct Qwen2VLConfig {
  VisionConfig vision;
  TextConfig text;
  TokenIds tokens;
  nlohmann::json hf;  // the config.json this was read from (fields Loom does not use are kept on save)

  VisionFamily family() const { return vision.family; }
  std::string model_type() const {
    return vision.family == VisionFamily::qwen2_vl ? "qwen2_vl" : "qwen2_5_vl";
  }
};

// Reads a HuggingFace config.json object. `family` (qwen2_vl | qwen2_5_vl) must agree with its
// model_type when present. `source` names the file in errors.
Qwen2VLConfig parse_qwen2vl_config(const nlohmann::json& hf, const std::string& family,
                                   const std::string& source);

// The fields that decide the weights' names and shapes and the model's arithmetic, by their
// config.json names (vision ones as vision_config.NAME), each with its value as JSON text, in a
// fixed order: two configs describe the same architecture when these are equal.
std::vector<std::pair<std::string, std::string>> architecture_fields(const Qwen2VLConfig& config);

// The config.json object for a model (HF field names), starting from the fields it was read from.
nlohmann::json to_hf_config(const Qwen2VLConfig& config);

// Published configurations, for shapes-only listings: "qwen2-vl-2b", "qwen2-vl-7b", "qwen2-vl-72b",
// "qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen2.5-vl-72b".
nlohmann::json published_hf_config(const std::string& name);
std::vector<std::string> published_config_names();

}  // namespace loom::models
