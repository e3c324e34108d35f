// The Qwen3 form of the decoder's attention (models/text/decoder.h): no q/k/v biases, a head width
// of its own (q_proj wider than the model), and an RMSNorm over each head of q and of k before the
// rotary, checked against the same arithmetic written out with plain tensor operations.
#include <gtest/gtest.h>

#include <cmath>

#include "loom/models/text/decoder.h"
#include "loom/models/weights.h"

namespace loom::models {
namespace {

TextConfig qwen3_config() {
  TextConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.explicit_head_dim = 8;  // q_proj: 16 -> 32, wider than the model
  c.attention_bias = false;
  c.qk_norm = true;
  c.rms_norm_eps = 1e-6;
  return c;
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps) * weight;
}

at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

TEST(TextDecoder, Qwen3AttentionNormsEachHeadBeforeTheRotary) {
  const TextConfig c = qwen3_config();
  TextAttention attention(c, {});
  EXPECT_FALSE(attention.q_proj->bias.defined());
  EXPECT_EQ(attention.q_proj->weight.sizes(), (at::IntArrayRef{32, 16}));
  EXPECT_EQ(attention.q_norm->weight.sizes(), (at::IntArrayRef{8}));
  at::manual_seed(3);
  {
    at::NoGradGuard no_grad;
    for (auto& p : attention.parameters()) p.copy_(at::randn(p.sizes()) * 0.3 + (p.dim() == 1 ? 1.0 : 0.0));
  }
  const int64_t b = 2, l = 5, d = 8;
  const at::Tensor x = at::randn({b, l, c.hidden_size});
  // 1-D rotary tables: position p, frequency theta^(-2i/d).
  const at::Tensor inv = at::pow(c.rope_theta, -at::arange(0, d, 2, at::kDouble) / d).to(at::kFloat);
  const at::Tensor angles = at::arange(l, at::kFloat).unsqueeze(1) * inv.unsqueeze(0);  // (l, d/2)
  const at::Tensor emb = at::cat({angles, angles}, -1).view({1, l, 1, d}).expand({b, l, 1, d});
  const at::Tensor cos = emb.cos(), sin = emb.sin();

  const at::Tensor got = attention.forward(x, cos, sin);

  at::NoGradGuard no_grad;
  auto q = at::linear(x, attention.q_proj->weight).view({b, l, 4, d});
  auto k = at::linear(x, attention.k_proj->weight).view({b, l, 2, d});
  const auto v = at::linear(x, attention.v_proj->weight).view({b, l, 2, d});
  q = rms(q, attention.q_norm->weight, c.rms_norm_eps);
  k = rms(k, attention.k_norm->weight, c.rms_norm_eps);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  // (b, heads, l, d), each key/value head read by two query heads.
  const auto qh = q.transpose(1, 2);
  const auto kh = k.transpose(1, 2).repeat_interleave(2, 1), vh = v.transpose(1, 2).repeat_interleave(2, 1);
  auto scores = at::matmul(qh, kh.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
  scores = scores.masked_fill(at::ones({l, l}, at::kBool).triu(1), -INFINITY);
  const auto out = at::matmul(scores.softmax(-1), vh).transpose(1, 2).reshape({b, l, 4 * d});
  const at::Tensor want = at::linear(out, attention.o_proj->weight);
  EXPECT_TRUE(got.allclose(want, 1e-5, 1e-5)) << (got - want).abs().max();
}

TEST(TextDecoder, Qwen3ModelHasTheHfNames) {
  const TextModel model(qwen3_config(), {});
  std::vector<std::string> names;
  for (const auto& [name, param] : named_parameters(model)) names.push_back(name);
  for (const char* name : {"layers.0.self_attn.q_norm.weight", "layers.0.self_attn.k_norm.weight"})
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  for (const auto& name : names) EXPECT_EQ(name.find("_proj.bias"), std::string::npos) << name;
}

}  // namespace
}  // namespace loom::models
