// InternVL2.5 / InternVL3 / InternVL3.5 (transformers' InternVLForConditionalGeneration, -hf
// checkpoints) read from and written as config.json: the vision tower and projector (vision.h) and a
// Qwen2 or Qwen3 language model (models/text), with its image token and published configurations.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/models/internvl/vision.h"
#include "loom/models/text/config.h"

namespace loom::models {

struct InternVLConfig {
  InternVisionConfig vision;
  InternVLProjectorConfig projector;
  TextModelConfig language;    // 1-D rotary positions
  int64_t image_token_id = 0;  // <IMG_CONTEXT>: the tokens the image embeddings replace
  nlohmann::json hf;           // the config.json it was read from (kept on save)

  const TextConfig& text() const { return language.text; }
};

// Reads an -hf config.json object (model_type internvl); `source` names it in errors. The top-level
// tie_word_embeddings decides tying, as transformers 5 does (text_config's when it is absent).
InternVLConfig parse_internvl_config(const nlohmann::json& hf, const std::string& source);

// The fields that decide the weights' names and shapes and the model's arithmetic, as (name, value
// as JSON text), in a fixed order.
std::vector<std::pair<std::string, std::string>> internvl_architecture_fields(const InternVLConfig& config);

// Published configurations for `loom shapes`: internvl2.5-1b, internvl3-1b, internvl3.5-1b (their
// sources are in docs/models.md).
std::vector<std::string> internvl_published_names();
nlohmann::json internvl_published_config(const std::string& name);

}  // namespace loom::models
