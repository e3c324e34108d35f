// The multi-tensor AdamW pass against the composite form, tensor by tensor, over several steps:
// tensors of different sizes (one spanning several tasks, several sharing one), with and without
// decay, fp32 and bf16 gradients, a bf16 parameter receiving the rounded weight; and bad inputs.
#include "loom/kernels/adamw.h"

#include <gtest/gtest.h>

#include "loom/kernels/cpu/vector.h"
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

// The fp32 weight as a bf16 parameter and a residual (AdamWTensor::residual), split element by
// element with the kernel's codec; ties lists the elements whose residual is +0x8000.
struct Split {
  at::Tensor param, residual;
  std::vector<int64_t> ties;
};

Split split_of(const at::Tensor& w) {
  Split out{at::empty(w.sizes(), at::kBFloat16), at::empty(w.sizes(), at::kShort), {}};
  auto* h = reinterpret_cast<uint16_t*>(out.param.data_ptr<at::BFloat16>());
  for (int64_t i = 0; i < w.numel(); ++i) {
    const float wi = w.data_ptr<float>()[i];
    bool tie = false;
    h[i] = cpu::to_bf16(wi);
    out.residual.data_ptr<int16_t>()[i] = cpu::bf16_residual(wi, h[i], tie);
    if (tie) out.ties.push_back(i);
  }
  return out;
}

TEST(FusedAdamW, SplitWeightMatchesTheFp32MasterBitForBit) {
  at::manual_seed(11);
  // One tensor over four tasks (and many chunks), and a small one.
  const std::vector<int64_t> sizes = {100003, 5};
  std::vector<AdamWTensor> plain, split;
  std::vector<Split> halves;
  halves.reserve(sizes.size());
  for (int64_t n : sizes) {
    at::Tensor w = at::randn({n});
    // Ties of both kinds, some at task (32768) and chunk (512) edges: a low half of exactly 0x8000
    // rounds down under an even high half (residual +0x8000) and up under an odd one (-0x8000).
    auto* bits = reinterpret_cast<uint32_t*>(w.data_ptr<float>());
    for (int64_t i : {0L, 3L, 511L, 512L, 32767L, 32768L, 65536L, 99999L, 100002L})
      if (i < n) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;
    bits[0] = 0x3f808000u;  // even high half: tie rounded down
    bits[3] = 0x3f818000u;  // odd: up
    plain.push_back({w, {}, at::zeros({n}), at::zeros({n}), true, w.to(at::kBFloat16)});
    halves.push_back(split_of(w));
    split.push_back({at::Tensor(),
                     {},
                     at::zeros({n}),
                     at::zeros({n}),
                     true,
                     halves.back().param,
                     halves.back().residual,
                     &halves.back().ties});
  }
  const std::vector<int64_t> first_ties = halves[0].ties;
  ASSERT_GE(first_ties.size(), 2u);
  AdamWHyper h;
  h.beta2 = 0.95;
  h.weight_decay = 0.1;
  for (int64_t step = 1; step <= 5; ++step) {
    h.step = step;
    h.lr = step == 1 ? 0.0 : 1e-2;  // the first step keeps every weight, ties included
    for (size_t i = 0; i < sizes.size(); ++i) {
      const at::Tensor grad = at::randn({sizes[i]}).to(i == 0 ? at::kBFloat16 : at::kFloat);
      plain[i].grad = grad;
      split[i].grad = grad;
    }
    adamw_step(plain, h);
    adamw_step(split, h);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const std::string what = fmt::format("tensor {} step {}", i, step);
      const Split want = split_of(plain[i].weight);
      EXPECT_TRUE(halves[i].param.equal(plain[i].bf16_param)) << what;
      EXPECT_TRUE(halves[i].residual.equal(want.residual)) << what;
      EXPECT_EQ(halves[i].ties, want.ties) << what;
      EXPECT_TRUE(split[i].exp_avg.equal(plain[i].exp_avg)) << what;
      EXPECT_TRUE(split[i].exp_avg_sq.equal(plain[i].exp_avg_sq)) << what;
    }
    if (step == 1) {
      EXPECT_EQ(halves[0].ties, first_ties);  // decoded and encoded again
    }
  }
}

TEST(FusedAdamW, BadInputsAreErrors) {
  AdamWTensor t{at::zeros({4}), at::zeros({3}), at::zeros({4}), at::zeros({4}), false, {}};
  EXPECT_THROW(adamw_step({t}, {}), ModelError);
  t.grad = at::zeros({4}, at::kDouble);
  EXPECT_THROW(adamw_step({t}, {}), ModelError);
  // A split weight needs its int16 residual, tie list and bf16 parameter, and no fp32 weight.
  std::vector<int64_t> ties;
  AdamWTensor s{at::Tensor(),
                at::zeros({4}),
                at::zeros({4}),
                at::zeros({4}),
                false,
                at::zeros({4}, at::kBFloat16),
                at::zeros({4}, at::kShort),
                &ties};
  EXPECT_NO_THROW(adamw_step({s}, {}));
  s.residual = at::zeros({4}, at::kInt);
  EXPECT_THROW(adamw_step({s}, {}), ModelError);
  s.residual = at::zeros({4}, at::kShort);
  s.ties = nullptr;
  EXPECT_THROW(adamw_step({s}, {}), ModelError);
  s.ties = &ties;
  s.weight = at::zeros({4});
  EXPECT_THROW(adamw_step({s}, {}), ModelError);
  EXPECT_THROW(adamw_step_composite(s, {}), ModelError);
}

}  // namespace
}  // namespace loom::kernels
