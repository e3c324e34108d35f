// Shapes-only construction of the published Qwen2-VL / Qwen2.5-VL sizes: HuggingFace names and
// shapes, exact parameter counts, and nothing allocated.
#include <gtest/gtest.h>

#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"

namespace loom::models {
namespace {

std::shared_ptr<Qwen2VLForConditionalGeneration> shapes_only(const std::string& name) {
  auto hf = published_hf_config(name);
  auto config = model_config_from_json(hf["model_type"].get<std::string>(), hf, name);
  parallel::ParamOptions options;
  options.shapes_only = true;
  return build_model(config, options);
}

std::map<std::string, std::vector<int64_t>> shapes(const Qwen2VLForConditionalGeneration& model) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& [name, p] : named_parameters(model)) {
    EXPECT_TRUE(p.is_meta()) << name;
    out[name] = p.sizes().vec();
  }
  return out;
}

// Counts from the published configs, worked by hand (see the test below for the sums).
TEST(ShapesOnly, Qwen2VL7BCountAndNames) {
  auto model = shapes_only("qwen2-vl-7b");
  EXPECT_EQ(parameter_count(*model), 8291375616LL);
  auto s = shapes(*model);
  // 32 vision blocks x 12 tensors + patch embed + merger 6 + 28 layers x 12 + embed, norm, lm_head.
  EXPECT_EQ(s.size(), 32u * 12 + 1 + 6 + 28u * 12 + 3);
  using V = std::vector<int64_t>;
  EXPECT_EQ(s.at("visual.patch_embed.proj.weight"), (V{1280, 3, 2, 14, 14}));
  EXPECT_EQ(s.at("visual.blocks.31.attn.qkv.weight"), (V{3840, 1280}));
  EXPECT_EQ(s.at("visual.blocks.0.attn.qkv.bias"), (V{3840}));
  EXPECT_EQ(s.at("visual.blocks.0.mlp.fc1.weight"), (V{5120, 1280}));
  EXPECT_EQ(s.at("visual.blocks.0.mlp.fc2.weight"), (V{1280, 5120}));
  EXPECT_EQ(s.at("visual.blocks.0.norm1.bias"), (V{1280}));
  EXPECT_EQ(s.at("visual.merger.ln_q.bias"), (V{1280}));
  EXPECT_EQ(s.at("visual.merger.mlp.0.weight"), (V{5120, 5120}));
  EXPECT_EQ(s.at("visual.merger.mlp.2.weight"), (V{3584, 5120}));
  EXPECT_EQ(s.at("model.embed_tokens.weight"), (V{152064, 3584}));
  EXPECT_EQ(s.at("model.layers.27.self_attn.k_proj.weight"), (V{512, 3584}));
  EXPECT_EQ(s.at("model.layers.0.self_attn.k_proj.bias"), (V{512}));
  EXPECT_EQ(s.count("model.layers.0.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(s.at("model.layers.0.mlp.gate_proj.weight"), (V{18944, 3584}));
  EXPECT_EQ(s.at("model.layers.0.input_layernorm.weight"), (V{3584}));
  EXPECT_EQ(s.at("model.norm.weight"), (V{3584}));
  EXPECT_EQ(s.at("lm_head.weight"), (V{152064, 3584}));
}

TEST(ShapesOnly, Qwen25VL7BCountAndNames) {
  auto model = shapes_only("qwen2.5-vl-7b");
  EXPECT_EQ(parameter_count(*model), 8292166656LL);
  auto s = shapes(*model);
  // Vision blocks: norm1/norm2 weight only, qkv 2, proj 2, gate/up/down 6 -> 12; merger ln_q weight only
  // -> 5.
  EXPECT_EQ(s.size(), 32u * 12 + 1 + 5 + 28u * 12 + 3);
  using V = std::vector<int64_t>;
  EXPECT_EQ(s.count("visual.blocks.0.norm1.bias"), 0u);
  EXPECT_EQ(s.count("visual.merger.ln_q.bias"), 0u);
  EXPECT_EQ(s.at("visual.blocks.0.mlp.gate_proj.weight"), (V{3420, 1280}));
  EXPECT_EQ(s.at("visual.blocks.0.mlp.up_proj.bias"), (V{3420}));
  EXPECT_EQ(s.at("visual.blocks.0.mlp.down_proj.weight"), (V{1280, 3420}));
  EXPECT_EQ(s.at("visual.merger.mlp.2.weight"), (V{3584, 5120}));
}

TEST(ShapesOnly, TiedSmallModelsHaveNoLmHead) {
  auto model = shapes_only("qwen2-vl-2b");
  EXPECT_EQ(shapes(*model).count("lm_head.weight"), 0u);
  EXPECT_EQ(model->config.text.vocab_size, 151936);
}

}  // namespace
}  // namespace loom::models
