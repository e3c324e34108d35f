#include "loom/train/schedule.h"

#include <gtest/gtest.h>

namespace loom::train {
namespace {

// 100 steps, 10 of warmup, from 1e-3 down to 1e-4.
double lr_at(int64_t step) { return learning_rate(step, 100, 10, 1e-3, 1e-4); }

TEST(LearningRate, LinearWarmup) {
  EXPECT_DOUBLE_EQ(lr_at(0), 1e-4);  // 1e-3 * 1/10
  EXPECT_DOUBLE_EQ(lr_at(4), 5e-4);  // 1e-3 * 5/10
  EXPECT_DOUBLE_EQ(lr_at(9), 1e-3);  // last warmup step reaches the peak
}

TEST(LearningRate, CosineDecay) {
  EXPECT_DOUBLE_EQ(lr_at(10), 1e-3);    // progress 0
  EXPECT_DOUBLE_EQ(lr_at(55), 5.5e-4);  // progress 45/90 = 1/2: halfway between 1e-3 and 1e-4
  // Last step: progress 89/90, cos(89pi/90) = -cos(2 degrees) = -0.9993908270190958, so
  // lr = 1e-4 + 0.45e-3 * 0.0006091729809042 = 1.0027412784140689e-4.
  EXPECT_NEAR(lr_at(99), 1.0027412784140689e-4, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(100), 1e-4);  // past the end: held at min_lr
  EXPECT_DOUBLE_EQ(lr_at(500), 1e-4);
}

TEST(LearningRate, NoWarmup) {
  EXPECT_DOUBLE_EQ(learning_rate(0, 10, 0, 2.0, 0.0), 2.0);
  EXPECT_DOUBLE_EQ(learning_rate(5, 10, 0, 2.0, 0.0), 1.0);  // progress 5/10
  EXPECT_DOUBLE_EQ(learning_rate(3, 4, 4, 2.0, 0.0), 2.0);   // all warmup
}

at::Tensor with_grad(const std::vector<float>& grad, at::ScalarType dtype = at::kFloat) {
  at::Tensor p = at::zeros({static_cast<int64_t>(grad.size())}, dtype).set_requires_grad(true);
  p.mutable_grad() = at::tensor(grad).to(dtype);
  return p;
}

TEST(ClipGradNorm, ScalesWhenAboveMax) {
  // grads (3, 4) and (12): norm sqrt(9 + 16 + 144) = 13.
  at::Tensor a = with_grad({3, 4}), b = with_grad({12}, at::kBFloat16);
  at::Tensor none = at::zeros({5}).set_requires_grad(true);  // no grad: skipped
  EXPECT_DOUBLE_EQ(clip_grad_norm({a, b, none}, 6.5), 13.0);
  const double scale = 6.5 / (13.0 + 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 3 * scale, 1e-6);
  EXPECT_NEAR(a.grad()[1].item<double>(), 4 * scale, 1e-6);
  EXPECT_EQ(b.grad()[0].item<float>(), 6.0f);  // 12 * scale = 5.9999995, rounded to bf16
  EXPECT_FALSE(none.grad().defined());
  // Clipped grads now have norm max_norm (to within the 1e-6 guard).
  EXPECT_NEAR(clip_grad_norm({a}, 0.0), 5 * scale, 1e-6);
}

TEST(ClipGradNorm, LeavesGradsBelowMaxOrWhenDisabled) {
  at::Tensor a = with_grad({3, 4});
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 20.0), 5.0);
  EXPECT_TRUE(at::equal(a.grad(), at::tensor({3.0f, 4.0f})));
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, 0.0), 5.0);  // max_norm <= 0: measure only
  EXPECT_DOUBLE_EQ(clip_grad_norm({a}, -1.0), 5.0);
  EXPECT_TRUE(at::equal(a.grad(), at::tensor({3.0f, 4.0f})));
  EXPECT_DOUBLE_EQ(clip_grad_norm({}, 1.0), 0.0);
}

}  // namespace
}  // namespace loom::train
