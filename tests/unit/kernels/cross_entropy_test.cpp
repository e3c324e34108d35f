// The chunked LM head + cross-entropy against the composite (whole logits, ATen's cross-entropy):
// the loss and the gradients of hidden and weight, with ignored labels, chunks that do not divide
// the rows (and one chunk larger than all of them), fp32 and bf16; without a gradient wanted it
// computes only the loss; labels outside the vocabulary are an error.
#include "loom/kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

void expect_close(const at::Tensor& got, const at::Tensor& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double error = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  const double scale = std::max(1.0, want.to(at::kFloat).abs().max().item<double>());
  EXPECT_LE(error, tolerance * scale) << what << ": max error " << error;
}

TEST(LinearCrossEntropy, MatchesTheCompositeChunkByChunk) {
  at::manual_seed(5);
  const int64_t n = 37, h = 24, vocab = 53;
  auto labels = at::randint(0, vocab, {n}, at::kLong);
  labels.index_put_({at::arange(0, n, 5)}, -100);  // every fifth row ignored
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (int64_t chunk : {1, 8, 64}) {
      const std::string what = fmt::format("{} chunk {}", c10::toString(dtype), chunk);
      auto hidden = at::randn({n, h}).to(dtype).set_requires_grad(true);
      auto weight = (at::randn({vocab, h}) * 0.5).to(dtype).set_requires_grad(true);
      auto hidden2 = hidden.detach().clone().set_requires_grad(true);
      auto weight2 = weight.detach().clone().set_requires_grad(true);
      auto loss = linear_cross_entropy_sum(hidden, weight, labels, -100, chunk);
      auto reference = linear_cross_entropy_sum_composite(hidden2, weight2, labels, -100);
      const double tolerance = dtype == at::kBFloat16 ? 2e-2 : 1e-5;
      expect_close(loss, reference, tolerance, what + " loss");
      (loss * 0.5).backward();
      (reference * 0.5).backward();
      ASSERT_EQ(hidden.grad().scalar_type(), dtype);
      expect_close(hidden.grad(), hidden2.grad(), tolerance, what + " d hidden");
      expect_close(weight.grad(), weight2.grad(), tolerance, what + " d weight");
    }
}

TEST(LinearCrossEntropy, WithoutGradientOnlyTheLoss) {
  at::manual_seed(6);
  auto hidden = at::randn({10, 8}), weight = at::randn({12, 8});
  auto labels = at::randint(0, 12, {10}, at::kLong);
  at::Tensor loss;
  {
    at::NoGradGuard no_grad;
    loss = linear_cross_entropy_sum(hidden, weight, labels, -100, 3);
  }
  EXPECT_FALSE(loss.requires_grad());
  expect_close(loss, linear_cross_entropy_sum_composite(hidden, weight, labels), 1e-5, "loss");
}

TEST(LinearCrossEntropy, BadInputsNameTheProblem) {
  auto hidden = at::randn({4, 8}), weight = at::randn({6, 8});
  EXPECT_THROW(linear_cross_entropy_sum(hidden, weight, at::tensor({0L, 1L, 6L, 2L})), ModelError);
  EXPECT_THROW(linear_cross_entropy_sum(hidden, at::randn({6, 7}), at::tensor({0L, 1L, 2L, 3L})), ModelError);
  EXPECT_THROW(linear_cross_entropy_sum(hidden, weight, at::tensor({0L, 1L, 2L, 3L}), -100, 0), ModelError);
}

}  // namespace
}  // namespace loom::kernels
