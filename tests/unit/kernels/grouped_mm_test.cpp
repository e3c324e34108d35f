// The grouped product against one matmul per group and against closed forms: empty groups, one
// row, every row in one group, and shapes off PyTorch's grouped-GEMM alignment (the per-group form).
#include "loom/kernels/grouped_mm.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loom::kernels {
namespace {

at::Tensor ends_of(const std::vector<int32_t>& counts) {
  return at::tensor(counts, at::kInt).cumsum(0).to(at::kInt);
}

// Forward and both gradients of grouped_mm against grouped_mm_loop (autograd over matmuls), for a
// random output gradient: equal to the bit, as both multiply each group's rows by one matmul.
void expect_matches_loop(int64_t k, int64_t n, const std::vector<int32_t>& counts, at::ScalarType dtype,
                         const std::string& what) {
  at::manual_seed(3);
  int64_t rows = 0;
  for (int32_t c : counts) rows += c;
  const at::Tensor x = at::randn({rows, k}).to(dtype),
                   w = at::randn({static_cast<int64_t>(counts.size()), n, k}).to(dtype);
  const at::Tensor grad = at::randn({rows, n}).to(dtype), ends = ends_of(counts);
  at::Tensor results[2][3];
  for (int form = 0; form < 2; ++form) {
    const at::Tensor xl = x.clone().requires_grad_(true), wl = w.clone().requires_grad_(true);
    const at::Tensor y = form == 0 ? grouped_mm(xl, wl, ends) : grouped_mm_loop(xl, wl, ends);
    y.backward(grad);
    results[form][0] = y;
    results[form][1] = xl.grad();
    results[form][2] = wl.grad().defined() ? wl.grad() : at::zeros_like(w);
  }
  static const char* names[] = {"y", "dx", "dw"};
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(at::equal(results[0][i], results[1][i])) << what << ": " << names[i];
}

TEST(GroupedMm, MatchesOneMatmulPerGroup) {
  // Aligned (PyTorch's grouped product) and not (one product per group here), fp32 and bf16.
  expect_matches_loop(64, 32, {5, 0, 17, 1, 9}, at::kFloat, "aligned fp32");
  expect_matches_loop(64, 32, {5, 0, 17, 1, 9}, at::kBFloat16, "aligned bf16");
  expect_matches_loop(10, 6, {5, 0, 17, 1, 9}, at::kFloat, "unaligned fp32");
  expect_matches_loop(64, 32, {0, 0, 23, 0}, at::kFloat, "every row in one group");
  expect_matches_loop(12, 5, {0, 1, 0}, at::kFloat, "one row");
}

TEST(GroupedMm, ClosedForms) {
  // Group e's weight is (e + 1) times the identity: each row comes out times its group's number;
  // an empty group's weight gradient is zero, and a weight's gradient is sum over its rows of
  // dy x^T (dy all ones: each column of the group's summed rows).
  for (const int64_t k : {8, 3}) {
    const std::vector<int32_t> counts{2, 0, 3};
    const at::Tensor x = at::arange(5 * k, at::kFloat).view({5, k}).requires_grad_(true);
    at::Tensor w = at::stack({at::eye(k), at::eye(k) * 2, at::eye(k) * 3}).requires_grad_(true);
    const at::Tensor y = grouped_mm(x, w, ends_of(counts));
    const at::Tensor factor = at::tensor({1.0F, 1.0F, 3.0F, 3.0F, 3.0F}).unsqueeze(1);
    EXPECT_TRUE(at::equal(y, x.detach() * factor)) << k;
    y.sum().backward();
    EXPECT_TRUE(at::equal(x.grad(), factor.expand({5, k}))) << k;
    EXPECT_TRUE(at::equal(w.grad()[1], at::zeros({k, k}))) << k;
    const at::Tensor column_sums = x.detach().narrow(0, 2, 3).sum(0);  // (k): rows 2..4
    EXPECT_TRUE(at::equal(w.grad()[2], column_sums.unsqueeze(0).expand({k, k}))) << k;
  }
}

TEST(GroupedMm, BadGroupsAreErrors) {
  const at::Tensor x = at::randn({4, 8}), w = at::randn({2, 8, 8});
  EXPECT_THROW(grouped_mm(x, w, at::tensor({2, 3}, at::kInt)), std::exception);  // ends short of 4 rows
  EXPECT_THROW(grouped_mm(x, w, at::tensor({3, 2}, at::kInt)), std::exception);  // decreasing
  EXPECT_THROW(grouped_mm(x, w, at::tensor({2, 2, 4}, at::kInt)),
               std::exception);  // three groups, two weights
}

}  // namespace
}  // namespace loom::kernels
