// Qwen3.5 and Qwen3.5-MoE (transformers' Qwen3_5ForConditionalGeneration and
// Qwen3_5MoeForConditionalGeneration) read from and written as config.json: text_config (the
// hybrid language model, text.h), vision_config (vision.h) and the token ids on the top level.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/models/qwen3_5/text.h"
#include "loom/models/qwen3_5/vision.h"

namespace loom::models::qwen3_5 {

struct Config {
  TextConfig text;
  VisionConfig vision;
  int64_t image_token_id = 0, video_token_id = 0, vision_start_token_id = 0, vision_end_token_id = 0;
  bool tie_word_embeddings = false;  // the top level's, as transformers decides tying
  int64_t max_position_embeddings = 0, bos_token_id = 0;
  nlohmann::json hf;  // the config.json it was read from (kept on save)
};

// Reads a config.json object of model_type qwen3_5 or qwen3_5_moe; `source` names it in errors.
// layer_types defaults as transformers does (full attention every full_attention_interval layers,
// 4 unless given); rope_parameters gives rope_theta, partial_rotary_factor (0.25) and mrope_section
// ([11, 11, 10]).
Config parse_config(const nlohmann::json& hf, const std::string& source);

// Published configurations for `loom shapes` and model.hf_config: qwen3.5-0.8b (model_type qwen3_5)
// and qwen3.5-35b-a3b (qwen3_5_moe); their sources are in docs/models.md.
std::vector<std::string> published_names(const std::string& model_type);
nlohmann::json published_config(const std::string& name);

// The fields that decide the weights' names and shapes and the model's arithmetic, as (name, value
// as JSON text), in a fixed order.
std::vector<std::pair<std::string, std::string>> architecture_fields(const Config& config);

}  // namespace loom::models::qwen3_5
