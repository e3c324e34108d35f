// FSDP on a one-process group: every pass must give the gradients of the unwrapped model (summed
// over micro-batches into the shards), the whole parameters must exist only while gathered, and
// the plan must name layers that exist and can be freed after they run. The split over several ranks is
// checked against one process in tests/e2e/data_parallel.sh and tests/e2e/fsdp.sh.
#include "loom/parallel/fsdp.h"

#include <gtest/gtest.h>

#include <chrono>

#include "loom/memory/recompute.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "one_process_group.h"
#include "tiny_qwen2_vl.h"

namespace loom::parallel {
namespace {

using testing::inputs;
using testing::loss;
using testing::tiny_model;

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

// Recompute inside FSDP: each block is gathered again for its recompute in backward, and the shards'
// gradients are FSDP's alone, bit for bit.
TEST(Fsdp, RecomputeGathersTheUnitAgainAndGivesTheSameGradients) {
  const std::vector<std::string> plan{"visual.blocks.{*}", "model.layers.{*}"};
  auto once = tiny_model(), twice = tiny_model();
  auto fsdp = std::make_shared<FullyShardedModel>(testing::one_process_group(), trainable(*once),
                                                  once->layers(), plan);
  auto fsdp_recomputed = std::make_shared<FullyShardedModel>(testing::one_process_group(), trainable(*twice),
                                                             twice->layers(), plan);
  config::FeaturesSection full;
  full.recompute = "full";
  auto recompute = memory::recompute_runner(full, twice->layers());
  ASSERT_EQ(recompute->layers().size(), 4U);
  const core::RunnerChain plain_chain{fsdp}, recompute_chain{fsdp_recomputed, recompute};
  for (bool with_image : {true, false}) {
    fsdp->begin_pass();
    const at::Tensor plain_loss = loss(*once, inputs(with_image, 2), plain_chain);
    plain_loss.backward();
    fsdp->end_pass();
    fsdp_recomputed->begin_pass();
    const at::Tensor recomputed_loss = loss(*twice, inputs(with_image, 2), recompute_chain);
    recomputed_loss.backward();
    fsdp_recomputed->end_pass();
    EXPECT_TRUE(recomputed_loss.equal(plain_loss));
    for (const auto& [name, p] : trainable(*twice)) EXPECT_EQ(p.storage().nbytes(), 0U) << name;
  }
  for (size_t i = 0; i < fsdp->shards().size(); ++i)
    EXPECT_TRUE(fsdp_recomputed->shards()[i]->grad.equal(fsdp->shards()[i]->grad))
        << fsdp->shards()[i]->names().front();
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
