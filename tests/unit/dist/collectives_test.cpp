// Comm's collectives across real processes: this test runs as 4 ranks under `loom run -n 4`
// (tests/e2e/parallel_state.sh); alone it is skipped. Each rank r contributes values built from r,
// so every result has a closed form: sums and means of all-reduce (fp32 and bf16, summed in fp32),
// the chunks of a reduce-scatter, an all-gather in rank order (fp32 and bf16), and the started
// (asynchronous) forms of both.
#include <gtest/gtest.h>

#include "loom_run_world.h"

namespace loom::dist {
namespace {

TEST(CollectivesUnderLoomRun, EachHasItsClosedForm) {
  const auto comm = loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const int64_t rank = comm->rank();
  const double r = static_cast<double>(rank);
  const double sum_r = 0 + 1 + 2 + 3;

  // All-reduce: sum and mean, fp32 and bf16 (small integers, exact in bf16).
  at::Tensor a = at::full({5}, r + 1, at::kFloat), b = at::full({3}, r, at::kBFloat16);
  comm->all_reduce_sum({a, b});
  EXPECT_TRUE(a.equal(at::full({5}, sum_r + 4, at::kFloat)));
  EXPECT_TRUE(b.equal(at::full({3}, sum_r, at::kBFloat16)));
  at::Tensor m = at::full({2}, 2 * r, at::kFloat);
  comm->all_reduce_mean({m});
  EXPECT_TRUE(m.equal(at::full({2}, 2 * sum_r / 4, at::kFloat)));

  // Reduce-scatter: rank r sends k * 10 + r at element k of 8 (two per rank); rank r receives the
  // sums of elements 2r and 2r + 1: 4 * 10 * k + sum_r.
  at::Tensor send = at::arange(8, at::kFloat) * 10 + r, mine = at::empty({2}, at::kFloat);
  comm->reduce_scatter_sum(send, mine);
  EXPECT_TRUE(mine.equal(at::tensor({40.0F * (2 * rank) + 6, 40.0F * (2 * rank + 1) + 6})));
  at::Tensor started = at::empty({2}, at::kFloat);
  comm->start_reduce_scatter_sum(send, started)->wait();
  EXPECT_TRUE(started.equal(mine));

  // All-gather in rank order, fp32 and bf16 (whose bits travel as half's).
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor piece = at::full({3}, r + 0.5, dtype), whole = at::empty({12}, dtype);
    comm->start_all_gather_flat(piece, whole)->wait();
    EXPECT_TRUE(whole.equal(at::arange(4, at::kFloat).add(0.5).repeat_interleave(3).to(dtype)))
        << c10::toString(dtype);
  }
  comm->barrier();
}

}  // namespace
}  // namespace loom::dist
