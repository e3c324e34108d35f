// The flat layout ZeRO-1 and FSDP share, worked by hand, and fsdp_plan's module-path patterns.
#include "loom/parallel/flat_shard.h"

#include <gtest/gtest.h>

#include "loom/parallel/fsdp.h"

namespace loom::parallel {
namespace {

// Parameters of 6 + 3 + 4 = 13 elements over 4 ranks: slices of 4, padded to 16.
std::vector<at::Tensor> params() {
  return {at::arange(6, at::kFloat).view({2, 3}), at::arange(10, 13, at::kFloat),
          at::arange(20, 24, at::kFloat).view({2, 2}).to(at::kBFloat16)};
}

TEST(FlatShard, SlicesAreEqualAndPadded) {
  const FlatShard rank1({"a", "b", "c"}, params(), 1, 4);
  EXPECT_EQ(rank1.numel(), 13);
  EXPECT_EQ(rank1.slice_numel(), 4);
  EXPECT_EQ(rank1.padded_numel(), 16);
  EXPECT_EQ(rank1.offset(2), 9);
  // Rank 1 owns flat elements 4..7: a[4..5], then b[0..1].
  EXPECT_TRUE(rank1.master.equal(at::tensor({4.0F, 5.0F, 10.0F, 11.0F})));
  const auto a = rank1.overlap(0), b = rank1.overlap(1), c = rank1.overlap(2);
  EXPECT_EQ(a.in_param, 4);
  EXPECT_EQ(a.in_slice, 0);
  EXPECT_EQ(a.length, 2);
  EXPECT_EQ(b.in_param, 0);
  EXPECT_EQ(b.in_slice, 2);
  EXPECT_EQ(b.length, 2);
  EXPECT_EQ(c.length, 0);
  // Rank 3 owns 12..15: the last element of c, then padding (zeros).
  const FlatShard rank3({"a", "b", "c"}, params(), 3, 4);
  EXPECT_TRUE(rank3.master.equal(at::tensor({23.0F, 0.0F, 0.0F, 0.0F})));
  EXPECT_EQ(rank3.has_grad, (std::vector<bool>{false, false, false}));
}

TEST(FlatShard, FlattenTakeAndUnflattenRoundTrip) {
  const auto p = params();
  const FlatShard shard({"a", "b", "c"}, p, 2, 4);
  at::Tensor flat = shard.flatten({p[0], at::Tensor(), p[2]}, at::kFloat);  // b missing: zeros
  ASSERT_EQ(flat.numel(), 16);
  EXPECT_TRUE(flat.narrow(0, 6, 3).equal(at::zeros({3})));
  EXPECT_TRUE(shard.unflatten(flat, 2).equal(p[2].to(at::kFloat)));
  EXPECT_TRUE(shard.unflatten(flat, 0).equal(p[0]));
  at::Tensor slice = at::full({4}, -1.0F);
  shard.take_slice({p[0], at::Tensor(), p[2]}, slice);  // rank 2: b[2], c[0..2]; b undefined: kept
  EXPECT_TRUE(slice.equal(at::tensor({-1.0F, 20.0F, 21.0F, 22.0F})));
}

TEST(FsdpPlan, PatternsMatchModulePathsPartByPart) {
  EXPECT_TRUE(fsdp_plan_matches("model.layers.{*}", "model.layers.0"));
  EXPECT_TRUE(fsdp_plan_matches("model.layers.{*}", "model.layers.27"));
  EXPECT_FALSE(fsdp_plan_matches("model.layers.{*}", "model.layers"));
  EXPECT_FALSE(fsdp_plan_matches("model.layers.{*}", "model.layers.0.mlp"));
  EXPECT_FALSE(fsdp_plan_matches("model.layers.{*}", "model.layers.x"));
  EXPECT_TRUE(fsdp_plan_matches("visual.blocks.{0-15}", "visual.blocks.15"));
  EXPECT_FALSE(fsdp_plan_matches("visual.blocks.{0-15}", "visual.blocks.16"));
  EXPECT_TRUE(fsdp_plan_matches("visual.blocks.3", "visual.blocks.3"));
  EXPECT_FALSE(fsdp_plan_matches("visual.blocks.3", "visual.blocks.4"));
  EXPECT_FALSE(fsdp_plan_matches("visual.blocks.{a-b}", "visual.blocks.1"));
}

}  // namespace
}  // namespace loom::parallel
