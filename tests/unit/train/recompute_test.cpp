// Recompute on a real model: the tiny Qwen2-VL's loss and every parameter gradient, with its four
// blocks recomputed wholly (or only the first of them) or selectively, equal the plain run's bit
// for bit. With FSDP:
// fsdp_test.cpp; the trainer's runs over ranks: tests/e2e/recompute.sh.
#include "loom/memory/recompute.h"

#include <gtest/gtest.h>

#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "tiny_qwen2_vl.h"

namespace loom::memory {
namespace {

void expect_plain_gradients(int64_t recompute_layers, size_t recomputed, const std::string& mode = "full") {
  auto plain = testing::tiny_model(), twice = testing::tiny_model();
  config::FeaturesSection features;
  features.recompute = mode;
  features.recompute_layers = recompute_layers;
  auto runner = recompute_runner(features, twice->layers());
  ASSERT_EQ(runner->layers().size(), recomputed);
  for (bool with_image : {true, false}) {  // two micro-batches: the gradients add up alike
    const at::Tensor plain_loss = testing::loss(*plain, testing::inputs(with_image, 2));
    plain_loss.backward();
    const at::Tensor recomputed_loss = testing::loss(*twice, testing::inputs(with_image, 2), {runner});
    recomputed_loss.backward();
    EXPECT_TRUE(recomputed_loss.equal(plain_loss));
  }
  const auto want = models::named_parameters(*plain), got = models::named_parameters(*twice);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].second.grad().defined()) << got[i].first;
    EXPECT_TRUE(got[i].second.grad().equal(want[i].second.grad())) << got[i].first;
  }
}

TEST(Recompute, TinyQwen2VLGradientsAreBitIdenticalToThePlainRun) { expect_plain_gradients(0, 4); }

TEST(Recompute, TheFirstBlocksOnlyGiveThePlainGradientsToo) { expect_plain_gradients(1, 1); }

// Selective: the vision blocks' QuickGELU and every block's composite attention recomputed.
TEST(SelectiveRecompute, TinyQwen2VLGradientsAreBitIdenticalToThePlainRun) {
  expect_plain_gradients(0, 4, "selective");
}

TEST(Recompute, MoreLayersThanBlocksIsAConfigError) {
  config::FeaturesSection features;
  features.recompute = "full";
  features.recompute_layers = 5;
  try {
    recompute_runner(features, testing::tiny_model()->layers());
    FAIL() << "5 of 4 blocks was accepted";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "features.recompute_layers: 5 is more than the 4 blocks of this stage (visual.blocks.0 ... "
                 "model.layers.1)");
  }
}

}  // namespace
}  // namespace loom::memory
