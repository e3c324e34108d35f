// Incremental decoding with the key/value cache: at every step its logits are those of the whole
// sequence so far recomputed from scratch (so M-RoPE positions continue after an image exactly as the
// full rope_index gives them), and a left-padded batch decodes as each row alone.
#include <gtest/gtest.h>

#include <vector>

#include "loom/models/qwen2_vl/decoding.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

std::shared_ptr<Qwen2VLForConditionalGeneration> tiny(const std::string& model_type) {
  nlohmann::json hf = {{"model_type", model_type},
                       {"vocab_size", 40},
                       {"hidden_size", 32},
                       {"intermediate_size", 48},
                       {"num_hidden_layers", 2},
                       {"num_attention_heads", 4},
                       {"num_key_value_heads", 2},
                       {"tie_word_embeddings", model_type == "qwen2_5_vl"},
                       {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}}},
                       {"vision_start_token_id", 3},
                       {"vision_end_token_id", 4},
                       {"image_token_id", 5},
                       {"video_token_id", 6}};
  if (model_type == "qwen2_vl")
    hf["vision_config"] = {
        {"depth", 2}, {"embed_dim", 16}, {"num_heads", 2}, {"mlp_ratio", 2}, {"hidden_size", 32}};
  else
    hf["vision_config"] = {
        {"depth", 2},     {"hidden_size", 16}, {"out_hidden_size", 32},        {"intermediate_size", 24},
        {"num_heads", 2}, {"window_size", 56}, {"fullatt_block_indexes", {1}}, {"hidden_act", "silu"}};
  auto model = build_model(model_config_from_json(model_type, hf, "decoding_test"), {});
  init_parameters(*model, 21, 0.2);
  return model;
}

// A prompt of text around an 8x8-patch image (16 merged tokens) and a text-only one.
struct Prompt {
  std::vector<int64_t> ids;
  at::Tensor pixel_values, grid;  // undefined: no image
};

std::vector<Prompt> prompts() {
  at::manual_seed(3);
  Prompt with_image{{7, 8, 3}};
  for (int i = 0; i < 16; ++i) with_image.ids.push_back(5);
  with_image.ids.insert(with_image.ids.end(), {4, 9, 10});
  with_image.pixel_values = at::randn({64, 3 * 2 * 14 * 14});
  with_image.grid = at::tensor({1, 8, 8}, at::kLong).view({1, 3});
  Prompt text{{11, 12, 13, 14, 15}};
  return {with_image, text};
}

// The prompts left-padded into one batch.
VisionLanguageInputs batch(const std::vector<Prompt>& rows) {
  size_t longest = 0;
  for (const Prompt& p : rows) longest = std::max(longest, p.ids.size());
  VisionLanguageInputs in;
  in.input_ids = at::zeros({static_cast<int64_t>(rows.size()), static_cast<int64_t>(longest)}, at::kLong);
  in.attention_mask = at::zeros_like(in.input_ids);
  std::vector<at::Tensor> pixels, grids;
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t n = static_cast<int64_t>(rows[r].ids.size()), start = static_cast<int64_t>(longest) - n;
    in.input_ids[r].narrow(0, start, n).copy_(at::tensor(rows[r].ids, at::kLong));
    in.attention_mask[r].narrow(0, start, n).fill_(1);
    if (rows[r].pixel_values.defined()) {
      pixels.push_back(rows[r].pixel_values);
      grids.push_back(rows[r].grid);
    }
  }
  if (!pixels.empty()) {
    in.pixel_values = at::cat(pixels);
    in.image_grid_thw = at::cat(grids);
  }
  return in;
}

// The logits of the last token of `ids` (one row, with the prompt's image), the whole forward.
at::Tensor recomputed(const Qwen2VLForConditionalGeneration& model, const Prompt& prompt,
                      const std::vector<int64_t>& ids) {
  VisionLanguageInputs in;
  in.input_ids = at::tensor(ids, at::kLong).view({1, -1});
  in.pixel_values = prompt.pixel_values;
  in.image_grid_thw = prompt.grid;
  const at::Tensor hidden = model.hidden_states(in);
  return model.whole_logits(hidden.select(1, hidden.size(1) - 1));
}

constexpr int kSteps = 8;
constexpr int64_t kFirstWord = 7;  // ids below are special (vision, video): the test decodes words

// The most likely word of each row.
at::Tensor best_words(const at::Tensor& logits) {
  return logits.narrow(-1, kFirstWord, logits.size(-1) - kFirstWord).argmax(-1) + kFirstWord;
}

void check_against_recomputation(const std::string& model_type) {
  at::NoGradGuard no_grad;
  const auto model = tiny(model_type);
  for (const Prompt& prompt : prompts()) {
    Qwen2VLDecoder decoder(*model);
    at::Tensor logits = decoder.prefill(batch({prompt}));
    std::vector<int64_t> ids = prompt.ids;
    for (int step = 0; step < kSteps; ++step) {
      const at::Tensor full = recomputed(*model, prompt, ids);
      ASSERT_TRUE(at::allclose(logits, full, 1e-5, 1e-5))
          << model_type << " step " << step << ": max difference "
          << (logits - full).abs().max().item<float>();
      const int64_t token = best_words(logits).item<int64_t>();
      EXPECT_EQ(token, best_words(full).item<int64_t>()) << model_type << " step " << step;
      ids.push_back(token);
      logits = decoder.step(at::tensor({token}, at::kLong));
    }
    EXPECT_EQ(decoder.length(), static_cast<int64_t>(ids.size()));
  }
}

TEST(Qwen2VLDecoding, Qwen2VLCachedStepsEqualFullRecomputation) { check_against_recomputation("qwen2_vl"); }
TEST(Qwen2VLDecoding, Qwen2_5VLCachedStepsEqualFullRecomputation) {
  check_against_recomputation("qwen2_5_vl");
}

TEST(Qwen2VLDecoding, LeftPaddedBatchDecodesAsEachRowAlone) {
  at::NoGradGuard no_grad;
  const auto model = tiny("qwen2_vl");
  const std::vector<Prompt> rows = prompts();
  Qwen2VLDecoder together(*model);
  at::Tensor logits = together.prefill(batch(rows));
  std::vector<Qwen2VLDecoder> alone;
  std::vector<at::Tensor> alone_logits;
  for (const Prompt& p : rows) {
    alone.emplace_back(*model);
    alone_logits.push_back(alone.back().prefill(batch({p})));
  }
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor tokens = best_words(logits);
    for (size_t r = 0; r < rows.size(); ++r) {
      ASSERT_TRUE(at::allclose(logits[r], alone_logits[r][0], 1e-5, 1e-5))
          << "row " << r << " step " << step << ": max difference "
          << (logits[r] - alone_logits[r][0]).abs().max().item<float>() << " tokens " << tokens;
      EXPECT_EQ(tokens[r].item<int64_t>(), best_words(alone_logits[r])[0].item<int64_t>());
      alone_logits[r] = alone[r].step(tokens.narrow(0, r, 1));
    }
    logits = together.step(tokens);
  }
}

TEST(Qwen2VLDecoding, RightPaddedPromptsAreRefused) {
  const auto model = tiny("qwen2_vl");
  VisionLanguageInputs in;
  in.input_ids = at::tensor({11, 12, 0}, at::kLong).view({1, 3});
  in.attention_mask = at::tensor({1, 1, 0}, at::kLong).view({1, 3});
  Qwen2VLDecoder decoder(*model);
  EXPECT_THROW(decoder.prefill(in), ModelError);
}

}  // namespace
}  // namespace loom::models
