// The fused channel RMS norm (+ SiLU) of Wan's VAE against its composite (autograd through ATen's
// ops): outputs and both gradients, fp32 and bf16, with and without the SiLU, on shapes whose
// position counts are not multiples of a task's run or a vector width; the gamma gradient the same
// for one thread and several; a position of zeros (the clamped norm); and a gamma of the wrong size.
#include "loom/kernels/channel_norm.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

at::Tensor clone_leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

double max_error(const at::Tensor& got, const at::Tensor& want) {
  const double error = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  return error / std::max(1.0, want.to(at::kFloat).abs().max().item<double>());
}

struct Case {
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  bool silu;
};

void expect_matches_composite(const Case& c, double out_tol, double grad_tol) {
  const std::string what =
      fmt::format("[{}] {} silu {}", fmt::join(c.shape, ","), c10::toString(c.dtype), c.silu);
  std::vector<int64_t> gamma_shape(c.shape.size() - 1, 1);
  gamma_shape[0] = c.shape[1];
  auto x = (at::randn(c.shape) * 3.0).to(c.dtype).set_requires_grad(true);
  auto gamma = (at::rand(gamma_shape) + 0.5).to(c.dtype).set_requires_grad(true);
  auto x2 = clone_leaf(x), gamma2 = clone_leaf(gamma);
  const auto grad = at::randn(c.shape).to(c.dtype);
  auto y = channel_rms_norm(x, gamma, c.silu), ref = channel_rms_norm_composite(x2, gamma2, c.silu);
  ASSERT_EQ(y.sizes(), ref.sizes()) << what;
  ASSERT_EQ(y.scalar_type(), c.dtype) << what;
  EXPECT_LE(max_error(y, ref), out_tol) << what << " output";
  y.backward(grad);
  ref.backward(grad);
  ASSERT_EQ(gamma.grad().sizes(), gamma.sizes()) << what;
  EXPECT_LE(max_error(x.grad(), x2.grad()), grad_tol) << what << " dx";
  EXPECT_LE(max_error(gamma.grad(), gamma2.grad()), grad_tol * 5) << what << " dgamma";
}

TEST(ChannelRmsNorm, MatchesTheCompositeInFloat32) {
  at::manual_seed(1);
  for (bool silu : {false, true})
    for (auto shape : {std::vector<int64_t>{2, 8, 5, 12, 12}, std::vector<int64_t>{1, 96, 2, 6, 6},
                       std::vector<int64_t>{3, 3, 1, 7, 37}, std::vector<int64_t>{4, 16, 9, 9}})
      expect_matches_composite({shape, at::kFloat, silu}, 1e-6, 2e-6);
}

TEST(ChannelRmsNorm, MatchesTheCompositeInBfloat16) {
  at::manual_seed(2);
  for (bool silu : {false, true})
    for (auto shape : {std::vector<int64_t>{2, 8, 3, 12, 12}, std::vector<int64_t>{3, 5, 300}})
      expect_matches_composite({shape, at::kBFloat16, silu}, 1e-2, 2e-2);
}

TEST(ChannelRmsNorm, GammaGradientDoesNotDependOnThreads) {
  at::manual_seed(3);
  auto x = at::randn({2, 12, 3, 20, 20}).set_requires_grad(true);
  auto gamma = (at::rand({12, 1, 1, 1}) + 0.5).set_requires_grad(true);
  const auto grad = at::randn(x.sizes());
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  channel_rms_norm(x, gamma, true).backward(grad);
  const auto one = gamma.grad().clone();
  gamma.mutable_grad().reset();
  at::set_num_threads(std::max(2, threads));
  channel_rms_norm(x, gamma, true).backward(grad);
  at::set_num_threads(threads);
  EXPECT_TRUE(at::equal(gamma.grad(), one));
}

TEST(ChannelRmsNorm, ZeroPositionsAreClampedAsTheComposite) {
  // F.normalize's clamp: at a position whose channels are all 0 the norm is the eps, the output 0,
  // and the norm does not depend on x there (dx = dy * gamma * sqrt(C) / eps, no second term).
  at::manual_seed(4);
  auto x = at::randn({1, 6, 4, 5});
  x.select(2, 1).select(2, 2).zero_();
  x.set_requires_grad(true);
  auto gamma = (at::rand({6, 1, 1}) + 0.5).set_requires_grad(true);
  auto x2 = clone_leaf(x), gamma2 = clone_leaf(gamma);
  const auto grad = at::randn(x.sizes());
  auto y = channel_rms_norm(x, gamma, true), ref = channel_rms_norm_composite(x2, gamma2, true);
  EXPECT_LE(max_error(y, ref), 1e-6);
  EXPECT_EQ(y.select(2, 1).select(2, 2).abs().max().item<float>(), 0.0F);
  y.backward(grad);
  ref.backward(grad);
  EXPECT_LE(max_error(x.grad(), x2.grad()), 1e-6);
  EXPECT_LE(max_error(gamma.grad(), gamma2.grad()), 1e-5);
}

TEST(ChannelRmsNorm, RefusesAGammaOfTheWrongSize) {
  auto x = at::randn({1, 4, 2, 3});
  EXPECT_THROW(channel_rms_norm(x, at::ones({5, 1, 1}), false), ModelError);
  EXPECT_THROW(channel_rms_norm(at::randn({4, 3}), at::ones({3}), true), ModelError);
}

}  // namespace
}  // namespace loom::kernels
