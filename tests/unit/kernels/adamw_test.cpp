// The multi-tensor AdamW pass against the composite form, tensor by tensor, over several steps:
// tensors of different sizes (one spanning several tasks, several sharing one), with and without
// decay, fp32 and bf16 gradients, a bf16 parameter receiving the rounded weight; and bad inputs.
#include "loom/kernels/adamw.h"

#include <gtest/gtest.h>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

struct Case {
  int64_t size;
  bool decay;
  at::ScalarType grad_dtype;
  bool bf16_param;
};

AdamWTensor make(const Case& c) {
  AdamWTensor t;
  t.weight = at::randn({c.size});
  t.exp_avg = at::zeros({c.size});
  t.exp_avg_sq = at::zeros({c.size});
  t.decay = c.decay;
  if (c.bf16_param) t.bf16_param = t.weight.to(at::kBFloat16);
  return t;
}

AdamWTensor copy_of(const AdamWTensor& t) {
  return {t.weight.clone(),     at::Tensor(), t.exp_avg.clone(),
          t.exp_avg_sq.clone(), t.decay,      t.bf16_param.defined() ? t.bf16_param.clone() : at::Tensor()};
}

TEST(FusedAdamW, MatchesTheCompositeOverSteps) {
  at::manual_seed(7);
  const std::vector<Case> cases = {{100000, true, at::kFloat, false},   // several tasks
                                   {7, false, at::kFloat, false},       // small ones share a task
                                   {33, true, at::kBFloat16, false},    // bf16 gradient
                                   {70001, true, at::kBFloat16, true},  // bf16 parameter and gradient
                                   {5, false, at::kFloat, true}};
  std::vector<AdamWTensor> fused, reference;
  for (const Case& c : cases) {
    fused.push_back(make(c));
    reference.push_back(copy_of(fused.back()));
  }
  AdamWHyper h;
  h.lr = 1e-2;
  h.beta1 = 0.9;
  h.beta2 = 0.95;
  h.eps = 1e-8;
  h.weight_decay = 0.1;
  for (int64_t step = 1; step <= 4; ++step) {
    h.step = step;
    for (size_t i = 0; i < cases.size(); ++i) {
      const auto grad = at::randn({cases[i].size}).to(cases[i].grad_dtype);
      fused[i].grad = grad;
      reference[i].grad = grad;
      adamw_step_composite(reference[i], h);
    }
    adamw_step(fused, h);
    for (size_t i = 0; i < cases.size(); ++i) {
      const std::string what = fmt::format("tensor {} step {}", i, step);
      EXPECT_TRUE(fused[i].weight.allclose(reference[i].weight, 1e-6, 1e-6)) << what;
      EXPECT_TRUE(fused[i].exp_avg.allclose(reference[i].exp_avg, 1e-6, 1e-7)) << what;
      EXPECT_TRUE(fused[i].exp_avg_sq.allclose(reference[i].exp_avg_sq, 1e-6, 1e-9)) << what;
      if (cases[i].bf16_param) {
        // The parameter is the fp32 weight rounded to bf16, exactly as ATen rounds it.
        EXPECT_TRUE(fused[i].bf16_param.equal(fused[i].weight.to(at::kBFloat16))) << what;
      }
    }
  }
}

TEST(FusedAdamW, BadInputsAreErrors) {
  AdamWTensor t{at::zeros({4}), at::zeros({3}), at::zeros({4}), at::zeros({4}), false, {}};
  EXPECT_THROW(adamw_step({t}, {}), ModelError);
  t.grad = at::zeros({4}, at::kDouble);
  EXPECT_THROW(adamw_step({t}, {}), ModelError);
}

}  // namespace
}  // namespace loom::kernels
