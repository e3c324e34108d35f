// Expert parallelism's exchange across 4 real processes (run as ranks of `loom run -n 4` by
// tests/e2e/parallel_state.sh; alone it is skipped): 8 experts, 2 a rank, 2 picks a token. Rank 0
// has 3 tokens, rank 1 two, rank 2 four whose picks are all rank 0's experts, rank 3 one token;
// expert 5 gets none. Each expert multiplies its rows by its number + 1, so every token's output,
// every rank's rows per expert and the input's gradient have closed forms.
#include <gtest/gtest.h>

#include <vector>

#include "../dist/loom_run_world.h"
#include "loom/parallel/expert.h"

namespace loom::parallel {
namespace {

constexpr int64_t kExperts = 8, kLocal = 2;

const std::vector<std::vector<std::pair<int64_t, int64_t>>>& picks() {
  static const std::vector<std::vector<std::pair<int64_t, int64_t>>> by_rank{
      {{0, 7}, {1, 2}, {7, 0}}, {{3, 4}, {4, 3}}, {{0, 1}, {0, 1}, {1, 0}, {0, 1}}, {{6, 2}}};
  return by_rank;
}

TEST(ExpertsUnderLoomRun, ExchangeHasItsClosedForms) {
  const auto comm = dist::loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_parallel_tests";
  const int64_t r = comm->rank(), tokens = static_cast<int64_t>(picks()[r].size());
  std::vector<int64_t> flat;
  for (const auto& [a, b] : picks()[r]) flat.insert(flat.end(), {a, b});
  const at::Tensor chosen = at::tensor(flat, at::kLong).view({tokens, 2});
  // x[t] = (100 r + 10 t + 1, 100 r + 10 t + 2); pick weights 0.25 and 0.75.
  const at::Tensor x =
      (at::arange(tokens, at::kFloat).unsqueeze(1) * 10 + 100.0 * r + at::tensor({1.0F, 2.0F}).unsqueeze(0))
          .set_requires_grad(true);
  const at::Tensor weights = at::tensor({0.25F, 0.75F}).repeat({tokens, 1});
  const ExpertDispatch d = dispatch_by_expert(chosen, kExperts);
  at::Tensor seen_ends;
  const at::Tensor out = exchange_with_experts(
      d, dispatch_rows(d, x), comm, [&](const at::Tensor& rows, const at::Tensor& ends) {
        seen_ends = ends.clone();
        std::vector<float> factor;
        int64_t begin = 0;
        for (int64_t l = 0; l < kLocal; ++l) {
          const int64_t end = ends[l].item<int64_t>();
          factor.insert(factor.end(), end - begin, static_cast<float>(r * kLocal + l + 1));
          begin = end;
        }
        EXPECT_EQ(begin, rows.size(0));
        return rows * at::tensor(factor).unsqueeze(1);
      });
  // The rows this rank's experts got: every rank's picks of experts 2r and 2r + 1.
  int64_t count[kLocal] = {0, 0};
  for (const auto& rank_picks : picks())
    for (const auto& [a, b] : rank_picks)
      for (int64_t e : {a, b})
        if (e / kLocal == r) ++count[e % kLocal];
  EXPECT_TRUE(at::equal(
      seen_ends,
      at::tensor({static_cast<int32_t>(count[0]), static_cast<int32_t>(count[0] + count[1])}, at::kInt)))
      << seen_ends;
  const at::Tensor y = combine_rows(d, out, weights);
  std::vector<float> scale;
  for (const auto& [a, b] : picks()[r])
    scale.push_back(0.25F * static_cast<float>(a + 1) + 0.75F * static_cast<float>(b + 1));
  const at::Tensor factor = at::tensor(scale).unsqueeze(1);
  EXPECT_TRUE(at::allclose(y, x.detach() * factor)) << y;
  y.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), factor.expand({tokens, 2}))) << x.grad();
  comm->barrier();
}

}  // namespace
}  // namespace loom::parallel
