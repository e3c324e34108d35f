// Tensor-parallel pieces that need no other rank: how a parameter is cut from its whole tensor
// (fused q/k/v blocks keep whole heads), the layouts a model's layers report, and the
// vocabulary-parallel cross-entropy on one rank against ATen's. The multi-rank behaviour is
// checked against the single-process run in tests/e2e/tensor_parallel.sh.
#include "loom/parallel/tensor.h"

#include <gtest/gtest.h>

#include "loom/parallel/cross_entropy.h"

namespace loom::parallel {
namespace {

TEST(ShardLayout, FusedBlocksGiveEachRankItsRowsOfEveryBlock) {
  // A fused [q; k; v] of 3 blocks of 4 rows each, cut over 2 ranks: rank 1 holds rows 2-3 of each.
  const auto whole = at::arange(12, at::kFloat).view({12, 1});
  ShardLayout layout;
  layout.dim = 0;
  layout.parts = 3;
  layout.chunks = 2;
  layout.chunk = 1;
  EXPECT_TRUE(layout.slice(whole).equal(at::tensor({2.0F, 3.0F, 6.0F, 7.0F, 10.0F, 11.0F}).view({6, 1})));
  EXPECT_EQ(layout.whole_shape({6, 1}), (std::vector<int64_t>{12, 1}));
  // Columns (a row-parallel weight), one block.
  ShardLayout columns;
  columns.dim = 1;
  columns.chunks = 4;
  columns.chunk = 2;
  EXPECT_TRUE(
      columns.slice(at::arange(8, at::kFloat).view({1, 8})).equal(at::tensor({4.0F, 5.0F}).view({1, 2})));
  // Whole: untouched.
  EXPECT_TRUE(ShardLayout{}.slice(whole).is_same(whole));
  layout.chunks = 5;
  EXPECT_THROW(layout.slice(whole), std::exception);
}

TEST(ShardLayout, BlocksOfUnequalSizesEachSplit) {
  // Linear attention's fused [q; k; v]: q and k of 4 rows, v of 6, cut over 2 ranks: rank 1 holds
  // q's rows 2-3, k's 6-7 and v's 11-13.
  const auto whole = at::arange(14, at::kFloat).view({14, 1});
  TensorParallelGroup two;
  ShardLayout layout = sections_layout(two, 0, {4, 4, 6});
  layout.chunks = 2;
  layout.chunk = 1;
  EXPECT_EQ(layout.parts, 3);
  EXPECT_TRUE(
      layout.slice(whole).equal(at::tensor({2.0F, 3.0F, 6.0F, 7.0F, 11.0F, 12.0F, 13.0F}).view({7, 1})));
  EXPECT_EQ(layout.whole_shape({7, 1}), (std::vector<int64_t>{14, 1}));
  layout.chunks = 4;  // 6 rows do not split 4 ways
  EXPECT_THROW(layout.slice(whole), std::exception);
  ParamOptions options;
  ColumnParallelLinear qkv(8, std::vector<int64_t>{4, 4, 6}, false, options);
  EXPECT_EQ(qkv.weight.sizes(), (std::vector<int64_t>{14, 8}));
  EXPECT_EQ(qkv.layouts().at("weight").sections, (std::vector<int64_t>{4, 4, 6}));
}

TEST(ShardLayout, ALayerReportsItsParameters) {
  ParamOptions options;
  ColumnParallelLinear qkv(8, 24, true, options, 3);
  const auto layouts = qkv.layouts();
  ASSERT_EQ(layouts.size(), 2u);
  EXPECT_EQ(layouts.at("weight").dim, 0);
  EXPECT_EQ(layouts.at("weight").parts, 3);
  EXPECT_FALSE(layouts.at("weight").split());  // one rank: nothing is cut
  RowParallelLinear proj(8, 8, true, options);
  EXPECT_EQ(proj.layouts().at("weight").dim, 1);
  EXPECT_EQ(proj.layouts().at("bias").dim, -1);
  EXPECT_FALSE(proj.layouts().at("bias").partial_grad);
}

// On one rank (no group) the vocabulary-parallel loss is ATen's summed cross-entropy, with its
// ignored labels and its gradient.
TEST(VocabParallelCrossEntropy, OneRankIsAtensCrossEntropy) {
  auto logits = (at::randn({2, 5, 7}, at::kFloat) * 3).set_requires_grad(true);
  const auto labels = at::tensor({0, 6, -100, 3, 2, 5, -100, 1, 4, 4}, at::kLong).view({2, 5});
  auto loss = vocab_parallel_cross_entropy_sum(logits, labels, nullptr, 0);
  loss.backward();
  const auto grad = logits.grad().clone();
  logits.mutable_grad().reset();
  auto reference =
      at::cross_entropy_loss(logits.view({10, 7}), labels.view({10}), {}, at::Reduction::Sum, -100);
  reference.backward();
  EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-5);
  EXPECT_TRUE(at::allclose(grad, logits.grad(), 1e-6, 1e-6));
}

}  // namespace
}  // namespace loom::parallel
