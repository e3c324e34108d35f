// A Qwen2-VL of two decoder layers and two vision blocks, its inputs and its loss, for the tests
// of what wraps a model's layers (FSDP, recompute).
#pragma once
#include <memory>

#include "loom/core/layer.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"

namespace loom::testing {

inline std::shared_ptr<models::Qwen2VLForConditionalGeneration> tiny_model() {
  const nlohmann::json hf = {
      {"model_type", "qwen2_vl"},
      {"vocab_size", 40},
      {"hidden_size", 32},
      {"intermediate_size", 64},
      {"num_hidden_layers", 2},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 2},
      {"tie_word_embeddings", true},
      {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}}},
      {"vision_start_token_id", 3},
      {"vision_end_token_id", 4},
      {"image_token_id", 5},
      {"video_token_id", 6},
      {"vision_config",
       {{"depth", 2}, {"embed_dim", 16}, {"num_heads", 2}, {"mlp_ratio", 2}, {"hidden_size", 32}}}};
  auto model = models::build_model(models::model_config_from_json("qwen2_vl", hf, "tiny_qwen2_vl"), {});
  models::init_parameters(*model, 3, 0.2);
  return model;
}

// One 2x2-merged image of 4x4 patches (4 image tokens) inside 10 tokens, or text only.
inline models::VisionLanguageInputs inputs(bool with_image, int64_t seed) {
  at::manual_seed(seed);
  models::VisionLanguageInputs in;
  if (with_image) {
    in.input_ids = at::tensor({7, 3, 5, 5, 5, 5, 4, 9, 11, 12}, at::kLong).view({1, -1});
    in.pixel_values = at::randn({16, 3 * 2 * 14 * 14});
    in.image_grid_thw = at::tensor({1, 4, 4}, at::kLong).view({1, 3});
  } else {
    in.input_ids = at::randint(7, 40, {1, 10}, at::kLong);
  }
  in.attention_mask = at::ones_like(in.input_ids);
  return in;
}

// Every layer through `runners` (FSDP, recompute, or none), then the LM head and the mean token loss.
inline at::Tensor loss(const models::Qwen2VLForConditionalGeneration& model,
                       const models::VisionLanguageInputs& in, const core::RunnerChain& runners = {}) {
  const core::Stage stage{model.layers(), runners};
  auto logits = model.whole_logits(stage.forward({}, model.context(in)).get("hidden"));
  const int64_t n = logits.size(1);
  return at::cross_entropy_loss(logits.narrow(1, 0, n - 1).reshape({-1, logits.size(2)}),
                                in.input_ids.narrow(1, 1, n - 1).reshape({-1}));
}

}  // namespace loom::testing
