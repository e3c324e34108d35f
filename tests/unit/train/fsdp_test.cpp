// FSDP on a one-process group: every pass must give the gradients of the unwrapped model (summed
// over micro-batches into the shards), the whole parameters must exist only while gathered, and
// the plan must name layers that exist and can be freed after they run. The split over several ranks is
// checked against one process in tests/e2e/data_parallel.sh and tests/e2e/fsdp.sh.
#include "loom/parallel/fsdp.h"

#include <gtest/gtest.h>

#include <chrono>

#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "one_process_group.h"

namespace loom::parallel {
namespace {

std::shared_ptr<models::Qwen2VLForConditionalGeneration> tiny_model() {
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
  auto model = models::build_model(models::model_config_from_json("qwen2_vl", hf, "fsdp_test"), {});
  models::init_parameters(*model, 3, 0.2);
  return model;
}

// One 2x2-merged image of 4x4 patches (4 image tokens) inside 10 tokens, or text only.
models::VisionLanguageInputs inputs(bool with_image, int64_t seed) {
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

// Every layer through `runners` (FSDP, or none), then the LM head and the mean token loss.
at::Tensor loss(const models::Qwen2VLForConditionalGeneration& model, const models::VisionLanguageInputs& in,
                const core::RunnerChain& runners = {}) {
  const core::Stage stage{model.layers(), runners};
  auto logits = model.whole_logits(stage.forward({}, *model.context(in)).get("hidden"));
  const int64_t n = logits.size(1);
  return at::cross_entropy_loss(logits.narrow(1, 0, n - 1).reshape({-1, logits.size(2)}),
                                in.input_ids.narrow(1, 1, n - 1).reshape({-1}));
}

std::vector<std::pair<std::string, at::Tensor>> trainable(
    const models::Qwen2VLForConditionalGeneration& model) {
  return models::named_parameters(model);
}

// Passes under `plan` (whose units are `units`) against the unwrapped model.
void check_passes(const std::vector<std::string>& plan, const std::vector<std::string>& units) {
  auto plain = tiny_model(), sharded = tiny_model();
  auto fsdp = std::make_shared<FullyShardedModel>(testing::one_process_group(), trainable(*sharded),
                                                  sharded->layers(), plan);
  const core::RunnerChain runners{fsdp};
  EXPECT_EQ(fsdp->unit_names(), units);
  const auto params = trainable(*sharded);
  auto storage_bytes = [](const at::Tensor& t) { return t.storage().nbytes(); };
  for (const auto& [name, p] : params) EXPECT_EQ(storage_bytes(p), 0U) << name << " is whole outside a pass";
  EXPECT_ANY_THROW(loss(*sharded, inputs(true, 1), runners));  // sharded: nothing whole to run on

  // Two micro-batches, one without an image (the vision tower does not run): their gradients add up.
  for (bool with_image : {true, false}) {
    loss(*plain, inputs(with_image, 2)).backward();
    fsdp->begin_pass();
    loss(*sharded, inputs(with_image, 2), runners).backward();
    fsdp->end_pass();
    for (const auto& [name, p] : params) {
      EXPECT_EQ(storage_bytes(p), 0U) << name << " is whole after a pass";
      EXPECT_FALSE(p.grad().defined()) << name << " keeps a whole gradient after a pass";
    }
  }
  EXPECT_GT(fsdp->peak_transient_bytes(), 0);
  const auto plain_params = trainable(*plain);
  for (const auto& shard : fsdp->shards()) {
    std::vector<at::Tensor> grads;
    for (const auto& name : shard->names())
      for (const auto& [n, p] : plain_params)
        if (n == name) grads.push_back(p.grad());
    at::Tensor want = shard->flatten(grads, at::kFloat);
    EXPECT_TRUE(shard->grad.allclose(want, 1e-5, 1e-6)) << shard->names().front();
    for (size_t i = 0; i < shard->names().size(); ++i) EXPECT_TRUE(shard->has_grad[i]) << shard->names()[i];
  }

  // Whole again on request, with the values of the unwrapped model.
  fsdp->gather_all();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].second.equal(plain_params[i].second));
  at::NoGradGuard no_grad;
  EXPECT_TRUE(loss(*sharded, inputs(true, 3), runners).equal(loss(*plain, inputs(true, 3))));
  fsdp->release_all();
  for (const auto& [name, p] : params) EXPECT_EQ(storage_bytes(p), 0U) << name;
}

TEST(Fsdp, PassesGiveTheUnwrappedGradientsAndFreeTheWholeParameters) {
  check_passes({"visual.blocks.{*}", "model.layers.{*}"},
               {"root", "visual.blocks.0", "visual.blocks.1", "model.layers.0", "model.layers.1"});
}

// The layers around the blocks are units as well as the blocks are: the patch embedding and the
// merger (skipped with the vision tower in a pass without images) and the final norm.
TEST(Fsdp, AnyLayerCanBeAUnit) {
  check_passes({"visual.patch_embed", "visual.merger", "model.layers.1", "model.norm"},
               {"root", "visual.patch_embed", "visual.merger", "model.layers.1", "model.norm"});
}

TEST(Fsdp, NewWeightsAreResharded) {
  auto model = tiny_model();
  FullyShardedModel fsdp(testing::one_process_group(), trainable(*model), model->layers(),
                         {"model.layers.{*}"});
  EXPECT_EQ(fsdp.unit_names(), (std::vector<std::string>{"root", "model.layers.0", "model.layers.1"}));
  fsdp.gather_all();
  {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : trainable(*model)) p.fill_(0.5);
  }
  fsdp.reshard_from_parameters();
  fsdp.release_all();
  for (const auto& shard : fsdp.shards())
    EXPECT_TRUE(shard->master.narrow(0, 0, shard->numel()).eq(0.5).all().item<bool>());
}

TEST(Fsdp, APlanPatternThatNamesNoLayerIsAConfigError) {
  auto model = tiny_model();
  try {
    FullyShardedModel fsdp(testing::one_process_group(), trainable(*model), model->layers(),
                           {"model.layers.{*}", "lm_head"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "parallel.fsdp_plan: 'lm_head' names no layer of this model; its layers are visual.patch_embed to "
        "model.norm (patterns such as visual.blocks.{*}, model.layers.{0-3})");
  }
}

// The tied LM head reads the token embedding after the layers ran: it cannot be freed after its layer.
TEST(Fsdp, ATiedEmbeddingStaysInTheRootUnit) {
  auto model = tiny_model();
  try {
    FullyShardedModel fsdp(testing::one_process_group(), trainable(*model), model->layers(),
                           {"model.embed_tokens"});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(
        e.what(),
        "parallel.fsdp_plan: 'model.embed_tokens' names model.embed_tokens, whose parameters are also "
        "read outside it (a tied LM head reads the token embedding): it stays in the root unit");
  }
}

}  // namespace
}  // namespace loom::parallel
