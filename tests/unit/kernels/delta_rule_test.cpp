// The gated delta rule against transformers' own (tests/fixtures/delta-rule: Qwen3.5's
// torch_chunk_gated_delta_rule and torch_recurrent_gated_delta_rule, each sample run alone): lengths
// 1, 63, 64, 65 and 4096, packed samples (the state resets at each boundary), a given initial state;
// and the chunked form's gradients against the token-by-token form's.
#include "loom/kernels/delta_rule.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "delta_rule_fixture.h"

namespace loom::kernels {
namespace {

using Case = testing::DeltaRuleCase;

Case load(const std::string& name) { return testing::load_delta_rule_case(name); }

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

using DeltaRule = DeltaRuleResult (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, const std::vector<int64_t>&,
                                      const at::Tensor&, DeltaRuleOptions);

void expect_matches_transformers(const std::string& name, DeltaRule rule, double bound) {
  const Case c = load(name);
  const DeltaRuleResult got = rule(c.q, c.k, c.v, c.g, c.beta, c.cu_seqlens, c.initial_state, {});
  EXPECT_LT(max_diff(got.out, c.chunk), bound) << name;
  EXPECT_LT(max_diff(got.out, c.recurrent), bound) << name;
  EXPECT_LT(max_diff(got.final_state, c.final_state), bound) << name;
}

TEST(DeltaRule, CompositeMatchesTransformers) {
  for (const char* name : {"len1", "len63", "len64", "len65", "packed", "initial"})
    expect_matches_transformers(name, composite_delta_rule, 1e-6);
  for (const char* name : {"len4096", "packed4096"})
    expect_matches_transformers(name, composite_delta_rule, 2e-6);
}

TEST(DeltaRule, FusedKernelMatchesTransformers) {
  for (const char* name : {"len1", "len63", "len64", "len65", "packed", "initial"})
    expect_matches_transformers(name, delta_rule, 1e-6);
  for (const char* name : {"len4096", "packed4096"}) expect_matches_transformers(name, delta_rule, 2e-6);
}

// The gradients of every input (and of the initial state) given random output and final-state
// gradients, between two implementations: relative to the largest where it exceeds one, absolute
// below (a gradient that is zero in exact arithmetic, as g's is for one token from a zero state, is
// rounding noise in either).
double gradient_difference(const Case& c, DeltaRule first, DeltaRule second, DeltaRuleOptions options,
                           const char** worst) {
  std::vector<at::Tensor> grads[2];
  at::manual_seed(0);
  const at::Tensor dout = at::randn(c.v.sizes(), at::TensorOptions().dtype(at::kFloat));
  const at::Tensor dstate = at::randn(c.final_state.sizes(), at::TensorOptions().dtype(at::kFloat));
  const at::Tensor state0 = c.initial_state.defined() ? c.initial_state : at::zeros_like(c.final_state);
  for (int form = 0; form < 2; ++form) {
    std::vector<at::Tensor> inputs;
    for (const at::Tensor& x : {c.q, c.k, c.v, c.g, c.beta, state0})
      inputs.push_back(x.clone().requires_grad_(true));
    const DeltaRuleResult r = (form == 0 ? first : second)(inputs[0], inputs[1], inputs[2], inputs[3],
                                                           inputs[4], c.cu_seqlens, inputs[5], options);
    ((r.out * dout).sum() + (r.final_state * dstate).sum()).backward();
    for (const at::Tensor& x : inputs) grads[form].push_back(x.grad());
  }
  static const char* names[] = {"q", "k", "v", "g", "beta", "initial_state"};
  double most = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const double d =
        max_diff(grads[0][i], grads[1][i]) / std::max(grads[1][i].abs().max().item<double>(), 1.0);
    if (d >= most) {
      most = d;
      *worst = names[i];
    }
  }
  return most;
}

TEST(DeltaRule, FusedKernelGradientsMatchTheComposite) {
  // Chunks of 64 (the checkpoints fall inside the 65-token samples) and of 7 (many checkpoints).
  for (const int64_t chunk : {64, 7})
    for (const char* name : {"len1", "len63", "len64", "len65", "packed", "initial", "packed4096"}) {
      const char* worst = "";
      EXPECT_LT(gradient_difference(load(name), delta_rule, composite_delta_rule, {0, chunk}, &worst), 1e-5)
          << name << " chunk " << chunk << ": " << worst;
    }
}

TEST(DeltaRule, RecurrentMatchesTransformers) {
  for (const char* name : {"len1", "len63", "len64", "len65", "packed", "initial"})
    expect_matches_transformers(name, recurrent_delta_rule, 1e-6);
}

TEST(DeltaRule, PackedSamplesDoNotShareState) {
  // The packed case's middle sample is one token: run alone from a zero state, o = scale * beta *
  // (q . k) v, whatever came before it in the row.
  const Case c = load("packed");
  const DeltaRuleResult got = composite_delta_rule(c.q, c.k, c.v, c.g, c.beta, c.cu_seqlens);
  const int64_t t = c.cu_seqlens[1], repeat = c.v.size(1) / c.q.size(1);
  const at::Tensor qk = (c.q[t] * c.k[t]).sum(-1).repeat_interleave(repeat);  // (Hv)
  const at::Tensor expected =
      (qk * c.beta[t] / std::sqrt(static_cast<double>(c.q.size(2)))).unsqueeze(-1) * c.v[t];
  EXPECT_LT(max_diff(got.out[t], expected), 1e-6);
}

TEST(DeltaRule, CompositeGradientsMatchTheRecurrentForm) {
  for (const char* name : {"initial", "packed"}) {
    const char* worst = "";
    EXPECT_LT(gradient_difference(load(name), composite_delta_rule, recurrent_delta_rule, {}, &worst), 1e-5)
        << name << ": " << worst;
  }
}

}  // namespace
}  // namespace loom::kernels
