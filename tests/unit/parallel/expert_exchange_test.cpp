// Expert parallelism's exchange across 4 real processes (run as ranks of `loom run -n 4` by
// tests/e2e/parallel_state.sh; alone it is skipped): 8 experts, 2 a rank, 2 picks a token. Rank 0
// has 3 tokens, rank 1 two, rank 2 four whose picks are all rank 0's experts, rank 3 one token;
// expert 5 gets none. Each expert multiplies its rows by its number + 1, so every token's output,
// every rank's rows per expert and the input's and the weights' gradients have closed forms, with
// and without hot-expert replication (rank 0 computes 11 of the 20 rows: a router skewed by design).
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

// Each expert multiplies its rows by its weight, which is its number + 1 (a (local, 1) weight a rank).
struct Exchanged {
  at::Tensor x, y, weight;
  at::Tensor ends;  // the groups this rank computed
  ExchangeLoad load;
};

Exchanged exchange(const std::shared_ptr<dist::Comm>& comm, double replicate_above) {
  const int64_t r = comm->rank(), tokens = static_cast<int64_t>(picks()[r].size());
  std::vector<int64_t> flat;
  for (const auto& [a, b] : picks()[r]) flat.insert(flat.end(), {a, b});
  const at::Tensor chosen = at::tensor(flat, at::kLong).view({tokens, 2});
  Exchanged run;
  // x[t] = (100 r + 10 t + 1, 100 r + 10 t + 2); pick weights 0.25 and 0.75.
  run.x =
      (at::arange(tokens, at::kFloat).unsqueeze(1) * 10 + 100.0 * r + at::tensor({1.0F, 2.0F}).unsqueeze(0))
          .set_requires_grad(true);
  run.weight = (at::arange(kLocal, at::kFloat) + static_cast<float>(r * kLocal + 1))
                   .unsqueeze(1)
                   .set_requires_grad(true);
  const ExpertDispatch d = dispatch_by_expert(chosen, kExperts);
  const at::Tensor out = exchange_with_experts(
      d, dispatch_rows(d, run.x), {comm, replicate_above}, {run.weight},
      [&](const at::Tensor& rows, const at::Tensor& ends, const std::vector<at::Tensor>& weights) {
        run.ends = ends.clone();
        const at::Tensor group = at::repeat_interleave(
            at::arange(ends.size(0)), at::diff(ends.to(at::kLong), 1, 0, at::zeros({1}, at::kLong)));
        EXPECT_EQ(group.size(0), rows.size(0));
        return rows * weights.at(0).index_select(0, group);
      },
      {}, &run.load);
  run.y = combine_rows(d, out, at::tensor({0.25F, 0.75F}).repeat({tokens, 1}));
  run.y.sum().backward();
  return run;
}

TEST(ExpertsUnderLoomRun, ExchangeHasItsClosedForms) {
  const auto comm = dist::loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_parallel_tests";
  const int64_t r = comm->rank(), tokens = static_cast<int64_t>(picks()[r].size());
  // The rows each expert got, and each expert weight's gradient: the sum of its rows' elements times
  // their pick weights.
  std::vector<int64_t> count(kExperts, 0);
  std::vector<float> grad(kExperts, 0.0F);
  for (int64_t s = 0; s < 4; ++s)
    for (size_t t = 0; t < picks()[s].size(); ++t) {
      const auto [a, b] = picks()[s][t];
      const float row = 200.0F * s + 20.0F * t + 3.0F;
      ++count[a], ++count[b];
      grad[a] += 0.25F * row;
      grad[b] += 0.75F * row;
    }
  std::vector<float> scale;
  for (const auto& [a, b] : picks()[r])
    scale.push_back(0.25F * static_cast<float>(a + 1) + 0.75F * static_cast<float>(b + 1));
  const at::Tensor factor = at::tensor(scale).unsqueeze(1);
  const at::Tensor expected_grad =
      at::tensor(std::vector<float>(grad.begin() + r * kLocal, grad.begin() + (r + 1) * kLocal)).unsqueeze(1);
  // The rows per rank, every expert at its owner: 11, 4, 2 and 3 (the mean 5).
  const std::vector<int64_t> owned{11, 4, 2, 3};
  // Without replication, then copying rank 0's hottest expert (0, 6 rows) to rank 2 (the least
  // loaded) with rank 2's own 4 rows of it (half the difference, 4.5, takes whole sources): rank 0
  // computes 7, rank 2 6, 7 / 5 under the threshold 1.5.
  for (const double above : {0.0, 1.5}) {
    const Exchanged run = exchange(comm, above);
    EXPECT_TRUE(at::allclose(run.y, run.x.detach() * factor)) << above << run.y;
    EXPECT_TRUE(at::allclose(run.x.grad(), factor.expand({tokens, 2}))) << above << run.x.grad();
    EXPECT_TRUE(at::allclose(run.weight.grad(), expected_grad)) << above << run.weight.grad();
    EXPECT_EQ(run.load.most_before, 11.0);
    EXPECT_EQ(run.load.mean, 5.0);
    EXPECT_EQ(run.load.most, above > 0 ? 7.0 : 11.0);
    std::vector<int32_t> ends{static_cast<int32_t>(count[r * kLocal]),
                              static_cast<int32_t>(count[r * kLocal] + count[r * kLocal + 1])};
    if (above > 0 && r == 0) ends = {ends[0] - 4, ends[1] - 4};  // 4 rows of expert 0 went to rank 2
    if (above > 0 && r == 2) ends.push_back(ends[1] + 4);        // its copy of expert 0: 4 rows
    EXPECT_TRUE(at::equal(run.ends, at::tensor(ends, at::kInt))) << above << run.ends;
  }
  comm->barrier();
}

}  // namespace
}  // namespace loom::parallel
