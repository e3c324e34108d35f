// Qwen2-VL and Qwen2.5-VL as a list of layers: the layers come in forward order under their
// HuggingFace paths and hold every parameter but the LM head; the carry holds everything one layer
// hands the next, so the list cut anywhere into two stages run one after the other gives the
// hidden states of the whole list bit for bit.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

nlohmann::json text_config(const std::string& model_type) {
  return {{"model_type", model_type},
          {"vocab_size", 40},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"tie_word_embeddings", false},
          {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}}},
          {"vision_start_token_id", 3},
          {"vision_end_token_id", 4},
          {"image_token_id", 5},
          {"video_token_id", 6}};
}

std::shared_ptr<Qwen2VLForConditionalGeneration> qwen2_vl() {
  auto hf = text_config("qwen2_vl");
  hf["vision_config"] = {
      {"depth", 2}, {"embed_dim", 16}, {"num_heads", 2}, {"mlp_ratio", 2}, {"hidden_size", 32}};
  auto model = build_model(model_config_from_json("qwen2_vl", hf, "layers_test"), {});
  init_parameters(*model, 5, 0.2);
  return model;
}

// Windows of 2x2 merge units, block 1 attending fully.
std::shared_ptr<Qwen2VLForConditionalGeneration> qwen2_5_vl() {
  auto hf = text_config("qwen2_5_vl");
  hf["vision_config"] = {
      {"depth", 3},     {"hidden_size", 16}, {"out_hidden_size", 32},        {"intermediate_size", 24},
      {"num_heads", 2}, {"window_size", 56}, {"fullatt_block_indexes", {1}}, {"hidden_act", "silu"}};
  auto model = build_model(model_config_from_json("qwen2_5_vl", hf, "layers_test"), {});
  init_parameters(*model, 6, 0.2);
  return model;
}

// Two rows of 20 tokens: the first holds an image of 8x8 patches (16 merged tokens) between text
// tokens; the second is 10 text tokens and padding.
VisionLanguageInputs inputs() {
  at::manual_seed(11);
  std::vector<int64_t> first{7, 3};
  for (int i = 0; i < 16; ++i) first.push_back(5);
  first.push_back(4);
  first.push_back(9);
  std::vector<int64_t> second{8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  VisionLanguageInputs in;
  in.input_ids = at::stack({at::tensor(first, at::kLong), at::tensor(second, at::kLong)});
  in.attention_mask = at::ones_like(in.input_ids);
  in.attention_mask[1].narrow(0, 10, 10).zero_();
  in.pixel_values = at::randn({64, 3 * 2 * 14 * 14});
  in.image_grid_thw = at::tensor({1, 8, 8}, at::kLong).view({1, 3});
  return in;
}

void check_layers(const Qwen2VLForConditionalGeneration& model, const std::vector<std::string>& want) {
  const core::Layers layers = model.layers();
  std::vector<std::string> names, blocks;
  for (const auto& layer : layers) {
    names.push_back(layer->name());
    if (layer->block()) blocks.push_back(layer->name());
  }
  EXPECT_EQ(names, want);
  // Every parameter but the LM head lies in exactly one layer.
  for (const auto& [name, p] : named_parameters(model)) {
    int owners = 0;
    for (const auto& layer : layers) owners += name.rfind(layer->name() + ".", 0) == 0 ? 1 : 0;
    EXPECT_EQ(owners, name.rfind("lm_head.", 0) == 0 ? 0 : 1) << name;
  }
  for (const auto& name : blocks)
    EXPECT_TRUE(name.find(".blocks.") != std::string::npos || name.find(".layers.") != std::string::npos)
        << name;
}

void check_cuts(const Qwen2VLForConditionalGeneration& model) {
  at::NoGradGuard no_grad;
  const VisionLanguageInputs in = inputs();
  const at::Tensor whole = model.hidden_states(in);
  const core::Layers layers = model.layers();
  const auto context = model.context(in);
  for (size_t cut = 1; cut < layers.size(); ++cut) {
    const core::Stage first{core::Layers(layers.begin(), layers.begin() + cut), {}, true, false};
    const core::Stage last{core::Layers(layers.begin() + cut, layers.end()), {}, false, true};
    const core::Carry between = first.forward({}, context);
    EXPECT_TRUE(last.forward(between, context).get("hidden").equal(whole))
        << "cut before " << layers[cut]->name();
  }
  // The vision layers alone give the image embeddings.
  const at::Tensor image_embeds = model.image_embeddings(in.pixel_values, in.image_grid_thw);
  EXPECT_EQ(image_embeds.size(0), 16);
}

TEST(Qwen2VLLayers, Qwen2VLLayersInForwardOrder) {
  check_layers(*qwen2_vl(), {"visual.patch_embed", "visual.blocks.0", "visual.blocks.1", "visual.merger",
                             "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"});
}

TEST(Qwen2VLLayers, Qwen2_5VLLayersInForwardOrder) {
  check_layers(*qwen2_5_vl(),
               {"visual.patch_embed", "visual.blocks.0", "visual.blocks.1", "visual.blocks.2",
                "visual.merger", "model.embed_tokens", "model.layers.0", "model.layers.1", "model.norm"});
}

TEST(Qwen2VLLayers, Qwen2VLCutAnywhereGivesTheSameHiddenStates) { check_cuts(*qwen2_vl()); }

TEST(Qwen2VLLayers, Qwen2_5VLCutAnywhereGivesTheSameHiddenStates) { check_cuts(*qwen2_5_vl()); }

// Without images the vision layers have no work and the carry never holds their tensors.
TEST(Qwen2VLLayers, TextOnlyInputsPassTheVisionLayersOver) {
  at::NoGradGuard no_grad;
  auto model = qwen2_vl();
  VisionLanguageInputs in = inputs();
  in.input_ids = in.input_ids.narrow(0, 1, 1);
  in.attention_mask = in.attention_mask.narrow(0, 1, 1);
  in.pixel_values = at::Tensor();
  in.image_grid_thw = at::Tensor();
  const auto context = model->context(in);
  const core::Layers layers = model->layers();
  core::Carry carry;
  for (const auto& layer : layers) {
    const bool vision = layer->name().rfind("visual.", 0) == 0;
    EXPECT_EQ(layer->active(carry, *context), !vision) << layer->name();
    if (layer->active(carry, *context)) carry = layer->forward(std::move(carry), *context);
  }
  std::set<std::string> held;
  for (const auto& entry : carry.tensors()) held.insert(entry.first);
  EXPECT_EQ(held, std::set<std::string>{"hidden"});
  EXPECT_TRUE(carry.get("hidden").equal(model->hidden_states(in)));
}

TEST(Qwen2VLLayers, AMissingCarryEntryIsNamed) {
  core::Carry carry;
  carry.set("hidden", at::zeros({1}));
  try {
    (void)carry.get("vision_hidden");
    FAIL() << "expected a ModelError";
  } catch (const ModelError& e) {
    EXPECT_STREQ(e.what(), "a layer needs 'vision_hidden' in its carry, which holds hidden");
  }
}

}  // namespace
}  // namespace loom::models
