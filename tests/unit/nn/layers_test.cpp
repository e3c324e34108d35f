// Each layer's output and input gradients against a straightforward independent computation
// (explicit masks, per-element loops, finite differences in double precision).
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "loom/nn/attention.h"
#include "loom/nn/norm.h"
#include "loom/nn/rope.h"

namespace loom::nn {
namespace {

at::Tensor grad_of(const at::Tensor& out, const at::Tensor& weights, const at::Tensor& input) {
  return torch::autograd::grad({(out * weights).sum()}, {input}, {}, /*retain_graph=*/true)[0];
}

TEST(SegmentAttention, MatchesFullAttentionWithBlockDiagonalMask) {
  at::manual_seed(1);
  const std::vector<int64_t> cu{0, 4, 7, 11, 16, 22};  // lengths 4, 3, 4, 5, 6 (mixed and repeated)
  const int64_t n = 22, heads = 2, dim = 8;
  auto q = at::randn({n, heads, dim}, at::kDouble).requires_grad_();
  auto k = at::randn({n, heads, dim}, at::kDouble).requires_grad_();
  auto v = at::randn({n, heads, dim}, at::kDouble).requires_grad_();
  auto out = segment_attention(q, k, v, cu);

  // Reference: one softmax over all tokens with -inf outside each token's segment.
  auto mask = at::full({n, n}, -std::numeric_limits<double>::infinity(), at::kDouble);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    mask.slice(0, cu[s], cu[s + 1]).slice(1, cu[s], cu[s + 1]).fill_(0.0);
  auto qh = q.transpose(0, 1), kh = k.transpose(0, 1), vh = v.transpose(0, 1);
  auto ref = at::matmul(at::softmax(at::matmul(qh, kh.transpose(1, 2)) / std::sqrt(8.0) + mask, -1), vh)
                 .transpose(0, 1);
  EXPECT_TRUE(at::allclose(out, ref, 1e-10, 1e-10));

  auto w = at::randn_like(out);
  for (const auto& x : {q, k, v})
    EXPECT_TRUE(at::allclose(grad_of(out, w, x), grad_of(ref, w, x), 1e-9, 1e-9));
}

TEST(SegmentAttention, CausalGroupedSegmentsMatchCausalAttentionOnEachSegment) {
  at::manual_seed(4);
  const std::vector<int64_t> cu{0, 3, 7, 10, 14, 20};  // packed samples of 3, 4, 3, 4 and 6 tokens
  const int64_t n = 20, hq = 4, hkv = 2, dim = 5;
  auto q = at::randn({n, hq, dim}, at::kDouble).requires_grad_();
  auto k = at::randn({n, hkv, dim}, at::kDouble).requires_grad_();
  auto v = at::randn({n, hkv, dim}, at::kDouble).requires_grad_();
  auto out = segment_attention(q, k, v, cu, /*causal=*/true);
  // Reference: each sample alone through causal_attention (itself checked against a loop below).
  std::vector<at::Tensor> parts;
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    auto one = [&](const at::Tensor& x) { return x.slice(0, cu[s], cu[s + 1]).unsqueeze(0); };
    parts.push_back(causal_attention(one(q), one(k), one(v))[0]);
  }
  auto ref = at::cat(parts, 0);
  EXPECT_TRUE(at::allclose(out, ref, 1e-10, 1e-10));
  auto w = at::randn_like(out);
  for (const auto& x : {q, k, v})
    EXPECT_TRUE(at::allclose(grad_of(out, w, x), grad_of(ref, w, x), 1e-9, 1e-9));
}

TEST(CausalAttention, GroupedHeadsMatchPerElementLoop) {
  at::manual_seed(2);
  const int64_t b = 2, l = 5, hq = 4, hkv = 2, d = 3;
  auto q = at::randn({b, l, hq, d}, at::kDouble).requires_grad_();
  auto k = at::randn({b, l, hkv, d}, at::kDouble).requires_grad_();
  auto v = at::randn({b, l, hkv, d}, at::kDouble).requires_grad_();
  auto out = causal_attention(q, k, v);
  // Reference: for each query position, a softmax over keys 0..i of its kv group.
  std::vector<at::Tensor> rows;
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < l; ++i) {
        const int64_t g = h / (hq / hkv);
        auto keys = k[bi].slice(0, 0, i + 1).select(1, g);  // (i+1, d)
        auto vals = v[bi].slice(0, 0, i + 1).select(1, g);
        auto scores = at::mv(keys, q[bi][i][h]) / std::sqrt(3.0);
        rows.push_back(at::mv(vals.t(), at::softmax(scores, 0)));
      }
  // rows are in (b, h, i) order.
  auto ref = at::stack(rows).view({b, hq, l, d}).transpose(1, 2);
  EXPECT_TRUE(at::allclose(out, ref, 1e-10, 1e-10));
  auto w = at::randn_like(out);
  for (const auto& x : {q, k, v})
    EXPECT_TRUE(at::allclose(grad_of(out, w, x), grad_of(ref, w, x), 1e-9, 1e-9));
}

// Segments of kFlashMinLength tokens or more take the flash kernel (when fused attention is on);
// its result and gradients must be the composite's.
TEST(SegmentAttention, LongSegmentsTakeTheFlashKernelWithTheSameResult) {
  at::manual_seed(4);
  auto q = at::randn({300, 4, 16}).set_requires_grad(true),
       k = at::randn({300, 2, 16}).set_requires_grad(true);
  auto v = at::randn({300, 2, 16}).set_requires_grad(true), w = at::randn({300, 4, 16});
  auto padded_q = at::randn({2, 130, 4, 16}).set_requires_grad(true);
  auto padded_k = at::randn({2, 130, 2, 16}), padded_v = at::randn({2, 130, 2, 16}),
       pw = at::randn({2, 130, 4, 16});
  ASSERT_TRUE(fused_kernels());
  std::vector<at::Tensor> results;
  for (bool fused : {true, false}) {
    set_fused_kernels(fused);
    for (bool causal : {false, true}) {
      auto out = segment_attention(q, k, v, {0, 140, 300}, causal);
      results.push_back(out);
      results.push_back(grad_of(out, w, q));
      results.push_back(grad_of(out, w, k));
    }
    auto out = causal_attention(padded_q, padded_k, padded_v);
    results.push_back(out);
    results.push_back(grad_of(out, pw, padded_q));
  }
  set_fused_kernels(true);
  const size_t half = results.size() / 2;
  for (size_t i = 0; i < half; ++i)
    EXPECT_TRUE(results[i].allclose(results[half + i], 1e-5, 1e-5)) << "result " << i;
}

TEST(RMSNorm, OutputAndGradientMatchFormula) {
  parallel::ParamOptions options;
  options.dtype = at::kDouble;
  RMSNorm norm(6, 1e-6, options);
  {
    at::NoGradGuard g;
    norm.weight.copy_(at::linspace(0.5, 1.5, 6, at::kDouble));
  }
  auto x = at::randn({3, 6}, at::kDouble).requires_grad_();
  auto out = norm.forward(x);
  auto xs = x.detach();
  for (int64_t r = 0; r < 3; ++r) {
    double ms = 0;
    for (int64_t c = 0; c < 6; ++c) ms += xs[r][c].item<double>() * xs[r][c].item<double>() / 6;
    for (int64_t c = 0; c < 6; ++c)
      EXPECT_NEAR(out[r][c].item<double>(), xs[r][c].item<double>() / std::sqrt(ms + 1e-6) * (0.5 + 0.2 * c),
                  1e-9);
  }
  // Gradient by central finite differences of sum(out * w).
  auto w = at::randn_like(out);
  auto g = grad_of(out, w, x);
  for (int64_t i = 0; i < 18; ++i) {
    auto plus = xs.clone(), minus = xs.clone();
    plus.view(-1)[i] += 1e-6;
    minus.view(-1)[i] -= 1e-6;
    at::NoGradGuard guard;
    const double numeric =
        ((norm.forward(plus) * w).sum() - (norm.forward(minus) * w).sum()).item<double>() / 2e-6;
    EXPECT_NEAR(g.view(-1)[i].item<double>(), numeric, 1e-6);
  }
}

TEST(LayerNorm, MatchesFormula) {
  parallel::ParamOptions options;
  options.dtype = at::kDouble;
  LayerNorm norm(4, 1e-6, options);
  {
    at::NoGradGuard g;
    norm.weight.copy_(at::tensor({1.0, 2.0, 3.0, 4.0}, at::kDouble));
    norm.bias.copy_(at::tensor({0.1, 0.2, 0.3, 0.4}, at::kDouble));
  }
  auto x = at::tensor({1.0, 2.0, 4.0, 9.0}, at::kDouble);
  const double mean = 4.0, var = (9.0 + 4.0 + 0.0 + 25.0) / 4;
  auto out = norm.forward(x);
  for (int c = 0; c < 4; ++c)
    EXPECT_NEAR(out[c].item<double>(),
                (x[c].item<double>() - mean) / std::sqrt(var + 1e-6) * (c + 1) + 0.1 * (c + 1), 1e-9);
}

// The norms are whole on every rank; shard_layouts lists their parameters so the trainer knows
// whether their gradients are partial (only under sequence parallelism over a group of ranks).
TEST(Norms, ReportWholeLayoutsWithWholeGradientsOnOneRank) {
  parallel::ParamOptions options;
  options.tp.sequence_parallel = true;  // a group of one rank: nothing is split, nothing partial
  auto block = std::make_shared<torch::nn::Module>();
  block->register_module("norm1", std::make_shared<LayerNorm>(4, 1e-6, options));
  block->register_module("norm2", std::make_shared<RMSNorm>(4, 1e-6, options));
  const auto layouts = parallel::shard_layouts(*block);
  ASSERT_EQ(layouts.size(), 3u);
  for (const char* name : {"norm1.weight", "norm1.bias", "norm2.weight"}) {
    ASSERT_EQ(layouts.count(name), 1u) << name;
    EXPECT_EQ(layouts.at(name).dim, -1) << name;
    EXPECT_FALSE(layouts.at(name).partial_grad) << name;
  }
}

TEST(Rotary, RotatesPairsOfHalves) {
  // For one head of dim 4 the pairs are (x0, x2) and (x1, x3), each rotated by its angle.
  auto x = at::tensor({1.0, 2.0, 3.0, 4.0}, at::kFloat).view({1, 1, 4});
  const double a0 = 0.3, a1 = 1.1;
  auto angles = at::tensor({a0, a1, a0, a1}, at::kFloat).view({1, 1, 4});
  auto out = apply_rotary(x, angles.cos(), angles.sin()).view(-1);
  EXPECT_NEAR(out[0].item<double>(), 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(out[2].item<double>(), 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(out[1].item<double>(), 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(out[3].item<double>(), 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
}

TEST(VisionRope, PatchPositionsFollowMergeOrder) {
  // One 1x4x4 image: merge units of 2x2 patches, units row-major.
  auto pos = vision_patch_positions(at::tensor({1, 4, 4}, at::kLong).view({1, 3}), 2);
  const std::vector<int64_t> rows{0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3};
  const std::vector<int64_t> cols{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3};
  EXPECT_TRUE(at::equal(pos.select(1, 0), at::tensor(rows, at::kLong)));
  EXPECT_TRUE(at::equal(pos.select(1, 1), at::tensor(cols, at::kLong)));
  // Angles for head_dim 8: inverse frequencies of dim 4 are {1, 1/100}; layout [row f | col f] x 2.
  auto angles = vision_rope_angles(pos, 8, 10000.0);
  auto patch5 = angles[5];  // row 0, col 3
  const std::vector<double> expected{0, 0, 3, 0.03, 0, 0, 3, 0.03};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(patch5[i].item<double>(), expected[i], 1e-6);
}

TEST(MRope, SectionsTakeTheirAxis) {
  // head_dim 12, sections {1, 2, 3}: dim 0 from t, dims 1-2 from h, dims 3-5 from w, then repeated.
  auto position_ids = at::tensor({5, 7, 11}, at::kLong).view({3, 1, 1});
  auto angles = mrope_angles(position_ids, 12, 10000.0, {1, 2, 3}).view(-1);
  auto inv = rope_inverse_frequencies(12, 10000.0);
  const int64_t axis_pos[6] = {5, 7, 7, 11, 11, 11};
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(angles[i].item<double>(), axis_pos[i] * inv[i].item<double>(), 1e-5);
    EXPECT_NEAR(angles[i + 6].item<double>(), axis_pos[i] * inv[i].item<double>(), 1e-5);
  }
}

}  // namespace
}  // namespace loom::nn
