// Token dispatch to experts against closed forms: rows grouped by expert in token order, counts on
// the device, combine as the weighted sum of each token's picks; empty experts, one token, every
// token on one expert.
#include "loom/parallel/expert.h"

#include <gtest/gtest.h>

namespace loom::parallel {
namespace {

TEST(ExpertDispatch, GroupsRowsByExpertInTokenOrder) {
  // Three tokens, two picks each, four experts (expert 2 gets none).
  const at::Tensor chosen = at::tensor({1, 3, 0, 1, 3, 0}, at::kLong).view({3, 2});
  const ExpertDispatch d = dispatch_by_expert(chosen, 4);
  EXPECT_TRUE(at::equal(d.counts, at::tensor({2, 2, 0, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(d.ends, at::tensor({2, 4, 4, 6}, at::kInt)));
  // Slots (token * 2 + pick) by expert: 0 <- 2, 5; 1 <- 0, 3; 3 <- 1, 4.
  EXPECT_TRUE(at::equal(d.slot, at::tensor({2, 5, 0, 3, 1, 4}, at::kLong)));
  EXPECT_TRUE(at::equal(d.token, at::tensor({1, 2, 0, 1, 0, 2}, at::kLong)));
  const at::Tensor x = at::arange(6, at::kFloat).view({3, 2});
  EXPECT_TRUE(at::equal(dispatch_rows(d, x), x.index_select(0, d.token)));
  // Combine: token t gets sum over its picks of weight * row; rows here are 10 * expert + token.
  const at::Tensor expert_of_row = at::tensor({0, 0, 1, 1, 3, 3}, at::kFloat);
  const at::Tensor rows =
      (expert_of_row * 10 + d.token.to(at::kFloat)).unsqueeze(1).expand({6, 2}).contiguous();
  const at::Tensor weights = at::tensor({0.25F, 0.75F, 0.5F, 0.5F, 1.0F, 2.0F}).view({3, 2});
  const at::Tensor want = at::tensor({0.25F * 10 + 0.75F * 30,  // token 0: experts 1, 3
                                      0.5F * 1 + 0.5F * 11,     // token 1: experts 0, 1
                                      1.0F * 32 + 2.0F * 2})    // token 2: experts 3, 0
                              .unsqueeze(1)
                              .expand({3, 2});
  EXPECT_TRUE(at::allclose(combine_rows(d, rows, weights), want));
}

TEST(ExpertDispatch, OneTokenAndEveryTokenOnOneExpert) {
  const ExpertDispatch one = dispatch_by_expert(at::tensor({2}, at::kLong).view({1, 1}), 3);
  EXPECT_TRUE(at::equal(one.ends, at::tensor({0, 0, 1}, at::kInt)));
  const ExpertDispatch all = dispatch_by_expert(at::full({5, 1}, 1, at::kLong), 3);
  EXPECT_TRUE(at::equal(all.counts, at::tensor({0, 5, 0}, at::kLong)));
  EXPECT_TRUE(at::equal(all.token, at::arange(5, at::kLong)));
  const at::Tensor x = at::randn({5, 4});
  EXPECT_TRUE(at::equal(combine_rows(all, dispatch_rows(all, x), at::ones({5, 1})), x));
}

TEST(ExpertDispatch, APickBeyondTheExpertsIsAnError) {
  EXPECT_THROW(dispatch_by_expert(at::tensor({0, 4}, at::kLong).view({2, 1}), 4), std::exception);
}

at::Tensor mask(std::vector<int64_t> bits) { return at::tensor(bits, at::kLong).to(at::kBool); }

TEST(ExpertCapacity, IsTheCeilingOfTheFactorTimesTheMeanPicks) {
  EXPECT_EQ(expert_capacity(1.0, 8, 2, 4), 4);   // 16 picks over 4 experts
  EXPECT_EQ(expert_capacity(1.25, 8, 2, 4), 5);  // 5 exactly
  EXPECT_EQ(expert_capacity(1.1, 3, 1, 4), 1);   // ceil(0.825)
  EXPECT_EQ(expert_capacity(0.5, 1, 1, 8), 1);   // one token: ceil(1/16)
}

TEST(ExpertCapacity, KeepsEachExpertsHighestPriorityPicks) {
  // Four tokens, two picks each, three experts, capacity 2. Expert 0 has picks at slots 0, 2, 4, 6
  // with priorities 0.5, 0.9, 0.5, 0.7: it keeps 0.9 (slot 2) and 0.7 (slot 6); the tie at 0.5 goes to
  // neither. Expert 1: slots 1, 3 (both kept). Expert 2: slots 5, 7 with 0.1, 0.2 (both kept).
  const at::Tensor chosen = at::tensor({0, 1, 0, 1, 0, 2, 0, 2}, at::kLong).view({4, 2});
  const at::Tensor priority = at::tensor({0.5F, 0.4F, 0.9F, 0.1F, 0.5F, 0.1F, 0.7F, 0.2F}).view({4, 2});
  const at::Tensor kept = within_capacity(chosen, priority, 3, 2);
  EXPECT_TRUE(at::equal(kept, mask({0, 1, 1, 1, 0, 1, 1, 1}).view({4, 2})));
  // Capacity 3: of the tie, the earlier token (slot 0) keeps its place.
  EXPECT_TRUE(
      at::equal(within_capacity(chosen, priority, 3, 3), mask({1, 1, 1, 1, 0, 1, 1, 1}).view({4, 2})));
  // A capacity of every pick keeps all; an empty expert (3 of 4) changes nothing.
  EXPECT_TRUE(within_capacity(chosen, priority, 4, 8).all().item<bool>());
  // Every token on one expert, capacity 1: only the highest pick.
  const at::Tensor one =
      within_capacity(at::zeros({3, 1}, at::kLong), at::tensor({0.2F, 0.6F, 0.4F}).view({3, 1}), 2, 1);
  EXPECT_TRUE(at::equal(one, mask({0, 1, 0}).view({3, 1})));
}

TEST(ExpertCapacity, DroppedPicksAreNotDispatchedAndTheirTokensGoWithoutThem) {
  const at::Tensor chosen = at::tensor({0, 1, 0, 1, 0, 2, 0, 2}, at::kLong).view({4, 2});
  const at::Tensor kept = mask({0, 1, 1, 1, 0, 1, 1, 1}).view({4, 2});
  const ExpertDispatch d = dispatch_by_expert(chosen, 3, kept);
  EXPECT_TRUE(at::equal(d.counts, at::tensor({2, 2, 2}, at::kLong)));
  EXPECT_TRUE(at::equal(d.slot, at::tensor({2, 6, 1, 3, 5, 7}, at::kLong)));  // by expert, token order
  // Each row is its expert + 1: token 0 keeps only its expert-1 pick, token 2 only its expert-2.
  const at::Tensor rows = at::tensor({1.0F, 1.0F, 2.0F, 2.0F, 3.0F, 3.0F}).unsqueeze(1);
  const at::Tensor out = combine_rows(d, rows, at::ones({4, 2}));
  EXPECT_TRUE(at::equal(out.squeeze(1), at::tensor({2.0F, 3.0F, 3.0F, 4.0F})));
  EXPECT_THROW(dispatch_by_expert(chosen, 3, kept.view({2, 4})), std::exception);
}

}  // namespace
}  // namespace loom::parallel
