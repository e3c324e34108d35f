#include <gtest/gtest.h>

#include "loom/parallel/pipeline/cut.h"
#include "loom/util/errors.h"

namespace loom::parallel::pipeline {
namespace {

// A Qwen2-VL-shaped layer list: patch embedding, `vision` blocks, merger, token embedding, `llm`
// blocks, final norm; vision blocks cost 1, LLM blocks 2.
std::vector<LayerInfo> qwen_layers(int vision, int llm) {
  std::vector<LayerInfo> layers{{"visual.patch_embed", "visual", false, 0}};
  for (int i = 0; i < vision; ++i)
    layers.push_back({"visual.blocks." + std::to_string(i), "visual", true, 1});
  layers.push_back({"visual.merger", "visual", false, 0});
  layers.push_back({"model.embed_tokens", "llm", false, 0});
  for (int i = 0; i < llm; ++i) layers.push_back({"model.layers." + std::to_string(i), "llm", true, 2});
  layers.push_back({"model.norm", "llm", false, 0});
  return layers;
}

std::string message(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(PipelineCut, ListsPlaceEachTowersBlocksAndTheLayersAroundThem) {
  const auto layers = qwen_layers(2, 4);  // 0 patch, 1-2 blocks, 3 merger, 4 embed, 5-8 layers, 9 norm
  // Stage 0: the whole vision tower and one LLM block; the embedding goes with that block.
  EXPECT_EQ(cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {1, 3}}}),
            (std::vector<LayerRange>{{0, 6}, {6, 10}}));
  // Only vision blocks on stage 0: the merger ends it; the token embedding starts stage 1.
  EXPECT_EQ(cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {0, 4}}}),
            (std::vector<LayerRange>{{0, 4}, {4, 10}}));
  // The vision tower over two stages, the second also holding every LLM block.
  EXPECT_EQ(cut_stages(layers, 2, {{"visual", {1, 1}}, {"llm", {0, 4}}}),
            (std::vector<LayerRange>{{0, 2}, {2, 10}}));
  EXPECT_EQ(describe_cut(layers, cut_stages(layers, 3, {{"visual", {2, 0, 0}}, {"llm", {0, 1, 3}}})),
            "model.pipeline_layers: {visual: [2, 0, 0], llm: [0, 1, 3]}");
}

TEST(PipelineCut, TheDefaultSplitBalancesTheBlocksCost) {
  const auto layers = qwen_layers(2, 4);  // costs 1 1 2 2 2 2: 10 in all
  // Two stages: {1 1 2 2 | 2 2} (6 | 4) and {1 1 2 | 2 2 2} (4 | 6) tie; the later cut wins.
  EXPECT_EQ(describe_cut(layers, cut_stages(layers, 2, {})),
            "model.pipeline_layers: {visual: [2, 0], llm: [2, 2]}");
  // Three: the least largest run is 4, reached by several cuts; the later ones leave the last stage 2.
  EXPECT_EQ(describe_cut(layers, cut_stages(layers, 3, {})),
            "model.pipeline_layers: {visual: [2, 0, 0], llm: [1, 2, 1]}");
  EXPECT_EQ(describe_cut(layers, cut_stages(layers, 6, {})),
            "model.pipeline_layers: {visual: [1, 1, 0, 0, 0, 0], llm: [0, 0, 1, 1, 1, 1]}");
  EXPECT_EQ(cut_stages(layers, 1, {}), (std::vector<LayerRange>{{0, 10}}));
}

TEST(PipelineCut, BadListsAreOneLineErrorsNamingTheKey) {
  const auto layers = qwen_layers(2, 4);
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {1, 2}}});
            }),
            "model.pipeline_layers.llm: [1, 2] sums to 3, but the model has 4 llm blocks");
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"visual", {1, 0}}, {"llm", {0, 4}}});
            }),
            "model.pipeline_layers.visual: [1, 0] sums to 1, but the model has 2 visual blocks");
  EXPECT_EQ(
      message([&] {
        cut_stages(layers, 3, {{"visual", {2, 0, 0}}, {"llm", {2, 0, 2}}});
      }),
      "model.pipeline_layers: stage 1 holds no blocks of any tower (visual, llm); every stage needs one");
  EXPECT_EQ(
      message([&] {
        cut_stages(layers, 2, {{"visual", {0, 2}}, {"llm", {4, 0}}});
      }),
      "model.pipeline_layers: llm blocks on stage 0 would run before visual blocks on stage 1, but the model "
      "runs visual before llm (a later tower takes the same or later stages)");
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {1, 1, 2}}});
            }),
            "model.pipeline_layers.llm: 3 entries for 2 pipeline stages (parallel.pp x "
            "parallel.virtual_stages; one "
            "entry per stage, chunk-major: chunk 0 of every rank, then chunk 1, ...)");
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"llm", {1, 3}}});
            }),
            "model.pipeline_layers: no list for the tower visual (give one for each of visual, llm)");
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {1, 3}}, {"text", {0, 0}}});
            }),
            "model.pipeline_layers.text: the model has no tower text (its towers: visual, llm)");
  EXPECT_EQ(message([&] {
              cut_stages(layers, 2, {{"visual", {2, 0}}, {"llm", {-1, 5}}});
            }),
            "model.pipeline_layers.llm: entry 0 is -1; a stage holds 0 or more blocks");
  EXPECT_EQ(
      message([&] { cut_stages(layers, 7, {}); }),
      "parallel.pp x parallel.virtual_stages = 7 pipeline stages, but the model has 6 blocks; every stage "
      "needs at least one");
}

}  // namespace
}  // namespace loom::parallel::pipeline
