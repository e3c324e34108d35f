// InternVL's vision tower, pixel shuffle and projector against transformers 5.25's own on the two tiny
// random models of tests/fixtures/internvl-tiny (qwen2/: LayerNorm and q/k/v biases; qwen3/: RMSNorm,
// the q/k norm, no q/k/v biases), the pixel shuffle against transformers' view/permute form, the
// published 300M tower's parameter count, and the config fields the tower refuses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "loom/checkpoint/safetensors.h"
#include "loom/models/field_reader.h"
#include "loom/models/internvl/vision.h"
#include "loom/models/weights.h"
#include "loom/nn/attention.h"
#include "loom/nn/fused.h"
#include "loom/util/errors.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

using json = nlohmann::json;

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/internvl-tiny";

// Every parameter of `module` from the tensor named `prefix` + its name; every tensor under `prefix`
// in the file must be one of them (a missing bias, norm or layer scale would show).
void load_prefixed(torch::nn::Module& module, const checkpoint::WeightSource& source,
                   const std::string& prefix) {
  at::NoGradGuard no_grad;
  std::set<std::string> in_file, loaded;
  for (const auto& name : source.names())
    if (name.rfind(prefix, 0) == 0) in_file.insert(name);
  for (auto& [name, param] : named_parameters(module)) {
    const std::string full = prefix + name;
    ASSERT_TRUE(source.contains(full)) << full;
    ASSERT_EQ(source.shape(full), param.sizes().vec()) << full;
    param.copy_(source.load(full));
    loaded.insert(full);
  }
  EXPECT_EQ(loaded, in_file);
}

class InternVLVisionReference : public ::testing::TestWithParam<std::string> {};

TEST_P(InternVLVisionReference, HiddenStatesAndImageEmbeddingsMatch) {
  const std::string dir = kFixture + "/" + GetParam();
  const json hf = read_config_file(dir + "/config.json");
  const InternVisionConfig vision = parse_intern_vision_config(hf["vision_config"], dir + "/config.json");
  const InternVLProjectorConfig projection =
      parse_internvl_projector_config(hf, vision, dir + "/config.json");
  InternVisionModel tower(vision, {});
  InternVLProjector projector(projection, {});
  const checkpoint::WeightSource source(dir);
  load_prefixed(tower, source, "vision_tower.");
  load_prefixed(projector, source, "multi_modal_projector.");

  const testing::ReferenceFixture inputs(kFixture + "/inputs", GetParam());
  const testing::ReferenceFixture expected(dir + "/expected", GetParam());
  const json in = inputs.json("inputs.json");
  const json out = expected.json("expected.json");
  ASSERT_EQ(in["samples"].size(), 4u);
  at::NoGradGuard no_grad;
  for (const json& sample : in["samples"]) {
    const std::string name = sample["name"];
    // The sample's pixel_values: its images' files in prompt order.
    std::vector<at::Tensor> parts;
    for (const json& file : sample["pixel_values"])
      for (const auto& [image, entry] : in["images"].items())
        if (entry["pixel_values"] == file)
          parts.push_back(inputs.f32(file, entry["pixel_values_shape"].get<std::vector<int64_t>>()));
    ASSERT_EQ(parts.size(), sample["pixel_values"].size()) << name;
    const at::Tensor pixel_values = at::cat(parts, 0);
    EXPECT_EQ(pixel_values.sizes().vec(), sample["pixel_values_shape"].get<std::vector<int64_t>>()) << name;

    const InternVLImageFeatures features = internvl_image_features(tower, projector, pixel_values);
    const json& files = out["samples"][name];
    for (const char* what : {"vision_hidden", "image_embeds"}) {
      const at::Tensor reference =
          expected.f32(files[what]["file"], files[what]["shape"].get<std::vector<int64_t>>());
      const at::Tensor& actual =
          what == std::string("vision_hidden") ? features.vision_hidden : features.image_embeds;
      EXPECT_LT(expected.max_abs_diff(name + " " + what, actual, reference), 1e-4);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TinyModels, InternVLVisionReference, ::testing::Values("qwen2", "qwen3"));

TEST(InternVLVisionConfig, ReadsTheFixtureConfigs) {
  const json qwen2 = read_config_file(kFixture + "/qwen2/config.json");
  const InternVisionConfig v2 = parse_intern_vision_config(qwen2["vision_config"], "qwen2/config.json");
  EXPECT_EQ(v2.hidden_size, 32);
  EXPECT_EQ(v2.num_hidden_layers, 2);
  EXPECT_EQ(v2.num_attention_heads, 2);
  EXPECT_EQ(v2.intermediate_size, 64);
  EXPECT_EQ(v2.image_size, 28);  // [28, 28]
  EXPECT_EQ(v2.patch_size, 7);
  EXPECT_EQ(v2.tile_tokens(), 17);
  EXPECT_EQ(v2.norm_type, "layer_norm");
  EXPECT_TRUE(v2.attention_bias);
  EXPECT_FALSE(v2.use_qk_norm);
  EXPECT_TRUE(v2.use_mean_pooling);
  EXPECT_DOUBLE_EQ(v2.layer_norm_eps, 1e-6);
  const InternVLProjectorConfig p2 = parse_internvl_projector_config(qwen2, v2, "qwen2/config.json");
  EXPECT_EQ(p2.in_width, 128);
  EXPECT_EQ(p2.out_width, 64);
  EXPECT_EQ(p2.tokens_per_tile(v2), 4);

  const json qwen3 = read_config_file(kFixture + "/qwen3/config.json");
  const InternVisionConfig v3 = parse_intern_vision_config(qwen3["vision_config"], "qwen3/config.json");
  EXPECT_EQ(v3.norm_type, "rms_norm");
  EXPECT_FALSE(v3.attention_bias);
  EXPECT_TRUE(v3.use_qk_norm);
}

// The defaults are InternVLVisionConfig's (InternViT-300M at 448 px); an int image_size is a square.
TEST(InternVLVisionConfig, DefaultsAndIntSizes) {
  const json v = {{"hidden_size", 1024},       {"num_hidden_layers", 24}, {"num_attention_heads", 16},
                  {"intermediate_size", 4096}, {"image_size", 448},       {"patch_size", 14}};
  const InternVisionConfig c = parse_intern_vision_config(v, "config.json");
  EXPECT_EQ(c.grid_side(), 32);
  EXPECT_EQ(c.tile_tokens(), 1025);
  EXPECT_EQ(c.norm_type, "layer_norm");
  EXPECT_FALSE(c.attention_bias);
  const InternVLProjectorConfig p = parse_internvl_projector_config(
      {{"vision_config", v}, {"text_config", {{"hidden_size", 896}}}}, c, "config.json");
  EXPECT_EQ(p.tokens_per_tile(c), 256);
}

// Each refusal is one ConfigError naming the file and the field.
TEST(InternVLVisionConfig, RefusesWhatTheTowerDoesNotCompute) {
  const json fixture = read_config_file(kFixture + "/qwen2/config.json");
  auto vision_error = [&](const char* key, const json& value) {
    json v = fixture["vision_config"];
    v[key] = value;
    return testing::message_of<ConfigError>([&] { parse_intern_vision_config(v, "x/config.json"); });
  };
  auto top_error = [&](const char* key, const json& value) {
    json hf = fixture;
    hf[key] = value;
    const InternVisionConfig v = parse_intern_vision_config(hf["vision_config"], "x/config.json");
    return testing::message_of<ConfigError>([&] { parse_internvl_projector_config(hf, v, "x/config.json"); });
  };
  auto expect_names = [](const std::string& message, const std::string& field) {
    EXPECT_NE(message.find("x/config.json: " + field + ":"), std::string::npos) << message;
  };
  expect_names(vision_error("use_absolute_position_embeddings", false),
               "vision_config.use_absolute_position_embeddings");
  expect_names(vision_error("image_size", json::array({28, 35})), "vision_config.image_size");
  expect_names(vision_error("patch_size", "7"), "vision_config.patch_size");
  expect_names(vision_error("patch_size", 5), "vision_config.patch_size");  // does not divide 28
  expect_names(vision_error("norm_type", "batch_norm"), "vision_config.norm_type");
  expect_names(vision_error("hidden_act", "gelu_pytorch_tanh"), "vision_config.hidden_act");
  expect_names(vision_error("num_attention_heads", 3), "vision_config.num_attention_heads");
  expect_names(vision_error("layer_norm_eps", 0), "vision_config.layer_norm_eps");
  expect_names(vision_error("use_mask_token", true), "vision_config.use_mask_token");
  expect_names(vision_error("attention_dropout", 0.1), "vision_config.attention_dropout");
  expect_names(vision_error("model_type", "intern_vit_6b"), "vision_config.model_type");
  expect_names(vision_error("hidden_size", nullptr), "vision_config.hidden_size");  // required
  expect_names(top_error("vision_feature_layer", -2), "vision_feature_layer");
  expect_names(top_error("vision_feature_layer", json::array({-1})), "vision_feature_layer");
  expect_names(top_error("vision_feature_select_strategy", "full"), "vision_feature_select_strategy");
  expect_names(top_error("downsample_ratio", 0.25), "downsample_ratio");
  expect_names(top_error("projector_hidden_act", "relu"), "projector_hidden_act");
  expect_names(top_error("image_seq_length", 256), "image_seq_length");
  // A 35-px tile of 7-px patches is a 5x5 grid: no 2x2 shuffle.
  json odd = fixture["vision_config"];
  odd["image_size"] = 35;
  const InternVisionConfig v = parse_intern_vision_config(odd, "x/config.json");
  expect_names(
      testing::message_of<ConfigError>([&] { parse_internvl_projector_config(fixture, v, "x/config.json"); }),
      "downsample_ratio");
}

// InternVLModel.pixel_shuffle(scale 0.5) as transformers writes it, on (tiles, g, g, C) = (B, W, H, C).
at::Tensor reference_pixel_shuffle(const at::Tensor& grid) {
  const int64_t b = grid.size(0), w = grid.size(1), h = grid.size(2), c = grid.size(3);
  auto x = grid.view({b, w, h / 2, c * 2}).permute({0, 2, 1, 3}).contiguous();
  x = x.view({b, h / 2, w / 2, c * 4}).permute({0, 2, 1, 3}).contiguous();
  return x.reshape({b, -1, c * 4});
}

TEST(InternVLPixelShuffle, IsTransformersViewPermuteForm) {
  for (int64_t g : {2, 4, 8}) {
    const at::Tensor patches = at::randn({3, g * g, 5});
    EXPECT_TRUE(
        at::equal(internvl_pixel_shuffle(patches, g), reference_pixel_shuffle(patches.view({3, g, g, 5}))))
        << "grid " << g;
  }
  // Token (0, 0) of a 4x4 grid of scalar patches numbered row-major: patches 0, 1, 4, 5.
  const at::Tensor numbered = at::arange(16, at::kFloat).view({1, 16, 1});
  EXPECT_TRUE(at::equal(internvl_pixel_shuffle(numbered, 4)[0][0], at::tensor({0.0F, 1.0F, 4.0F, 5.0F})));
  EXPECT_THROW(internvl_pixel_shuffle(at::zeros({1, 9, 2}), 3), ModelError);
}

// The published InternViT-300M tower and InternVL3-1B's projector (D = 896), shapes only: the counts
// transformers gives (docs: /work/notes/internvl.md section 6).
TEST(InternVLVision, PublishedParameterCounts) {
  InternVisionConfig c;  // the defaults are InternViT-300M-448px-V2_5's, but for its q/k/v biases
  c.attention_bias = true;
  parallel::ParamOptions options;
  options.shapes_only = true;
  const auto tower = std::make_shared<InternVisionModel>(c, options);
  EXPECT_EQ(parameter_count(*tower), 304012288);
  const auto projector =
      std::make_shared<InternVLProjector>(InternVLProjectorConfig{4 * c.hidden_size, 896}, options);
  EXPECT_EQ(parameter_count(*projector), 4482816);
  EXPECT_FALSE(tower->layernorm);  // use_mean_pooling: no final norm
}

// Tiles of 145 tokens (12 x 12 patches + CLS) take the flash-attention and fused-norm path; it agrees
// with the composite one, and no tile sees another (a tile alone gives the same rows as in a batch).
TEST(InternVLVision, LongTilesStayApartThroughTheFusedKernels) {
  InternVisionConfig c;
  c.hidden_size = 32;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.intermediate_size = 64;
  c.image_size = 84;
  c.patch_size = 7;
  c.norm_type = "rms_norm";
  c.use_qk_norm = true;
  ASSERT_GE(c.tile_tokens(), nn::kFlashMinLength);
  const auto tower = std::make_shared<InternVisionModel>(c, parallel::ParamOptions{});
  init_parameters(*tower, 7, 0.5);
  at::NoGradGuard no_grad;
  const at::Tensor pixels = at::randn({3, 3, 84, 84});
  const bool was = nn::fused_kernels();
  nn::set_fused_kernels(true);
  const at::Tensor fused = tower->forward(pixels);
  const at::Tensor alone = tower->forward(pixels.narrow(0, 1, 1));
  nn::set_fused_kernels(false);
  const at::Tensor composite = tower->forward(pixels);
  nn::set_fused_kernels(was);
  EXPECT_LT((fused - composite).abs().max().item<double>(), 1e-4);
  EXPECT_LT((fused.narrow(0, 1, 1) - alone).abs().max().item<double>(), 1e-5);
}

TEST(InternVLVision, RefusesTilesOfAnotherSize) {
  const json hf = read_config_file(kFixture + "/qwen2/config.json");
  const InternVisionConfig c = parse_intern_vision_config(hf["vision_config"], "config.json");
  const InternVisionModel tower(c, {});
  EXPECT_THROW(tower.forward(at::zeros({1, 3, 56, 56})), ModelError);
  EXPECT_THROW(tower.forward(at::zeros({1, 1, 28, 28})), ModelError);
}

}  // namespace
}  // namespace loom::models
