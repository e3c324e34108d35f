// Flash attention against the composite (whole score matrices, masked softmax) on segments whose
// lengths are not multiples of the tile size, with and without the causal mask, GQA, an empty
// segment, and bf16 inputs: outputs, the log-sum-exp and the gradients of q, k and v.
#include "loom/kernels/attention.h"

#include <gtest/gtest.h>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

struct Inputs {
  at::Tensor q, k, v, grad;
};

Inputs inputs(int64_t tokens, int64_t heads, int64_t kv_heads, int64_t dim, at::ScalarType dtype,
              uint64_t seed) {
  at::manual_seed(seed);
  auto make = [&](int64_t h) { return at::randn({tokens, h, dim}).to(dtype).set_requires_grad(true); };
  return {make(heads), make(kv_heads), make(kv_heads), at::randn({tokens, heads, dim}).to(dtype)};
}

void expect_close(const at::Tensor& got, const at::Tensor& want, double tolerance, const std::string& what) {
  const double error = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  const double scale = std::max(1.0, want.to(at::kFloat).abs().max().item<double>());
  EXPECT_LE(error, tolerance * scale) << what;
}

void compare(const std::vector<int64_t>& cu, int64_t heads, int64_t kv_heads, int64_t dim, bool causal,
             at::ScalarType dtype, double tolerance, int64_t window = 0) {
  const std::string what =
      fmt::format("cu [{}], {}/{} heads, dim {}, causal {}, {}, window {}", fmt::join(cu, ","), heads,
                  kv_heads, dim, causal, c10::toString(dtype), window);
  Inputs a = inputs(cu.back(), heads, kv_heads, dim, dtype, 7);
  Inputs b = inputs(cu.back(), heads, kv_heads, dim, dtype, 7);
  // The reference computes in fp32 from the same (possibly bf16-rounded) values.
  auto widen = [](const at::Tensor& t) { return t.to(at::kFloat); };
  at::Tensor fused = flash_attention(a.q, a.k, a.v, cu, {causal, 0, window});
  at::Tensor reference = composite_attention(widen(b.q), widen(b.k), widen(b.v), cu, {causal, 0, window});
  ASSERT_EQ(fused.scalar_type(), dtype);
  expect_close(fused, reference, tolerance, what + ": output");
  (fused.to(at::kFloat) * a.grad.to(at::kFloat)).sum().backward();
  (reference * b.grad.to(at::kFloat)).sum().backward();
  expect_close(a.q.grad(), b.q.grad(), tolerance * 10, what + ": dq");
  expect_close(a.k.grad(), b.k.grad(), tolerance * 10, what + ": dk");
  expect_close(a.v.grad(), b.v.grad(), tolerance * 10, what + ": dv");
}

TEST(FlashAttention, MatchesTheCompositeOnPackedSegments) {
  const std::vector<int64_t> cu{0, 5, 70, 70, 200};  // lengths 5, 65, 0, 130: partial tiles, an empty one
  for (bool causal : {false, true}) {
    compare(cu, 4, 2, 16, causal, at::kFloat, 2e-6);  // GQA: two query heads per key/value head
    compare(cu, 2, 2, 32, causal, at::kFloat, 2e-6);
  }
  compare({0, 129}, 3, 1, 8, true, at::kFloat, 2e-6);
}

// Sliding windows shorter than a tile, across tiles, and longer than the segments, causal and not,
// over segments that are not multiples of the tiles.
TEST(FlashAttention, SlidingWindowMatchesTheComposite) {
  const std::vector<int64_t> cu{0, 300, 301, 1000};
  for (bool causal : {false, true})
    for (int64_t window : {1, 50, 130, 2000}) compare(cu, 4, 2, 16, causal, at::kFloat, 2e-6, window);
}

// With every score equal (q = 0) each query averages the values it sees, so the window's reach has
// a closed form: values v_j = j give the mean of j over [max(0, i - w + 1), i] (causal) or over
// [max(0, i - w + 1), min(L - 1, i + w - 1)].
TEST(FlashAttention, SlidingWindowSeesExactlyItsKeys) {
  const int64_t length = 200, window = 37;
  auto q = at::zeros({length, 1, 4}), k = at::randn({length, 1, 4});
  auto v = at::arange(length, at::kFloat).view({length, 1, 1}).expand({length, 1, 4}).contiguous();
  for (bool causal : {false, true}) {
    auto out = flash_attention(q, k, v, {0, length}, {causal, 0, window});
    for (int64_t i = 0; i < length; ++i) {
      const int64_t lo = std::max<int64_t>(0, i - window + 1);
      const int64_t hi = causal ? i : std::min<int64_t>(length - 1, i + window - 1);
      EXPECT_NEAR(out[i][0][0].item<double>(), (lo + hi) / 2.0, 1e-3)
          << "query " << i << " causal " << causal;
    }
  }
  EXPECT_THROW(flash_attention(q, k, v, {0, length}, {true, 0, -1}), ModelError);
}

TEST(FlashAttention, Bf16InputsComputeInFp32) {
  for (bool causal : {false, true}) compare({0, 40, 100}, 4, 2, 16, causal, at::kBFloat16, 2e-2);
}

TEST(FlashAttention, ReturnsTheLogSumExpOfEachQuerysScores) {
  Inputs x = inputs(90, 2, 1, 8, at::kFloat, 3);
  at::Tensor lse;
  flash_attention(x.q, x.k, x.v, {0, 90}, {/*causal=*/true}, &lse);
  ASSERT_EQ(lse.sizes(), (std::vector<int64_t>{2, 90}));
  at::NoGradGuard no_grad;
  auto scores = at::matmul(x.q.transpose(0, 1), x.k.transpose(0, 1).transpose(1, 2).repeat_interleave(2, 0)) /
                std::sqrt(8.0);
  scores = scores.masked_fill(at::ones({90, 90}, at::kBool).triu(1), -INFINITY);
  EXPECT_TRUE(lse.allclose(at::logsumexp(scores, -1), 1e-5, 1e-5));
}

TEST(FlashAttention, BadShapesAreModelErrors) {
  Inputs x = inputs(10, 3, 2, 8, at::kFloat, 1);
  EXPECT_THROW(flash_attention(x.q, x.k, x.v, {0, 10}), ModelError);  // 3 heads over 2 kv heads
  Inputs y = inputs(10, 2, 1, 8, at::kFloat, 1);
  EXPECT_THROW(flash_attention(y.q, y.k, y.v, {0, 9}), ModelError);  // does not cover the tokens
  EXPECT_THROW(flash_attention(y.q, y.k, y.v, {0, 6, 4, 10}), ModelError);
}

// The raw block functions on cu_seqlens' segments are flash_attention: the same output, log-sum-exp
// and gradients, from the CPU kernel and from the composite.
TEST(AttentionBlocks, SegmentBlocksAreFlashAttention) {
  const std::vector<int64_t> cu{0, 5, 70, 70, 200};
  for (bool causal : {false, true}) {
    Inputs x = inputs(200, 4, 2, 16, at::kFloat, 11);
    at::Tensor lse;
    at::Tensor out = flash_attention(x.q, x.k, x.v, cu, {causal}, &lse);
    (out * x.grad).sum().backward();
    const at::NoGradGuard no_grad;
    for (bool composite : {false, true}) {
      const std::string what = fmt::format("causal {} composite {}", causal, composite);
      const auto blocks = segment_blocks(cu);
      AttentionResult r = composite ? composite_attention_forward(x.q, x.k, x.v, blocks, {causal})
                                    : attention_forward(x.q, x.k, x.v, blocks, {causal});
      expect_close(r.out, out, 2e-6, what + ": out");
      expect_close(r.lse, lse, 2e-6, what + ": lse");
      AttentionGrads g =
          composite ? composite_attention_backward(x.grad, x.q, x.k, x.v, r.out, r.lse, blocks, {causal})
                    : attention_backward(x.grad, x.q, x.k, x.v, r.out, r.lse, blocks, {causal});
      expect_close(g.dq, x.q.grad(), 2e-5, what + ": dq");
      expect_close(g.dk, x.k.grad(), 2e-5, what + ": dk");
      expect_close(g.dv, x.v.grad(), 2e-5, what + ": dv");
    }
  }
}

// What ring attention rests on: a segment's keys cut into blocks held apart (here the keys in
// another tensor, in reverse order of the blocks), each block's partial result merged by its
// log-sum-exp, gives the segment's attention; and each block's backward, given the merged out and
// lse, gives that block's share of the gradients (dq summed over the blocks).
TEST(AttentionBlocks, PartialResultsMergeByLogSumExpIntoTheWhole) {
  const int64_t tokens = 300, cut = 113;  // keys [0, 113) and [113, 300), neither a tile multiple
  Inputs x = inputs(tokens, 4, 1, 8, at::kFloat, 5);
  at::Tensor want = flash_attention(x.q, x.k, x.v, {0, tokens});
  (want * x.grad).sum().backward();
  const at::NoGradGuard no_grad;
  // The keys stored as [second part, first part]: each block names where its keys are.
  const at::Tensor k2 = at::cat({x.k.narrow(0, cut, tokens - cut), x.k.narrow(0, 0, cut)});
  const at::Tensor v2 = at::cat({x.v.narrow(0, cut, tokens - cut), x.v.narrow(0, 0, cut)});
  const std::vector<AttentionBlock> first{{0, tokens, tokens - cut, cut}},
      second{{0, tokens, 0, tokens - cut}};
  for (bool composite : {false, true}) {
    auto forward = composite ? composite_attention_forward : attention_forward;
    auto backward = composite ? composite_attention_backward : attention_backward;
    AttentionResult a = forward(x.q, k2, v2, first, {}), b = forward(x.q, k2, v2, second, {});
    const at::Tensor lse = at::logaddexp(a.lse, b.lse);  // (H, T)
    auto weight = [&](const at::Tensor& part) { return at::exp(part - lse).transpose(0, 1).unsqueeze(-1); };
    const at::Tensor out = a.out * weight(a.lse) + b.out * weight(b.lse);
    expect_close(out, want, 2e-6, fmt::format("composite {}: merged out", composite));
    AttentionGrads ga = backward(x.grad, x.q, k2, v2, out, lse, first, {});
    AttentionGrads gb = backward(x.grad, x.q, k2, v2, out, lse, second, {});
    expect_close(ga.dq + gb.dq, x.q.grad(), 2e-5, "dq");
    const at::Tensor dk = ga.dk + gb.dk, dv = ga.dv + gb.dv;  // each block wrote only its keys
    expect_close(at::cat({dk.narrow(0, tokens - cut, cut), dk.narrow(0, 0, tokens - cut)}), x.k.grad(), 2e-5,
                 "dk");
    expect_close(at::cat({dv.narrow(0, tokens - cut, cut), dv.narrow(0, 0, tokens - cut)}), x.v.grad(), 2e-5,
                 "dv");
  }
}

// Queries in no block get out 0 and lse -inf, and no gradient; blocks are checked.
TEST(AttentionBlocks, UncoveredQueriesAndBadBlocks) {
  Inputs x = inputs(20, 2, 2, 8, at::kFloat, 2);
  const at::NoGradGuard no_grad;
  for (bool composite : {false, true}) {
    const std::vector<AttentionBlock> blocks{{4, 6, 0, 20}};
    AttentionResult r = composite ? composite_attention_forward(x.q, x.k, x.v, blocks)
                                  : attention_forward(x.q, x.k, x.v, blocks);
    EXPECT_EQ(r.out.narrow(0, 0, 4).abs().max().item<float>(), 0.0F);
    EXPECT_TRUE(at::isinf(r.lse.narrow(1, 10, 10)).all().item<bool>());
    AttentionGrads g = composite ? composite_attention_backward(x.grad, x.q, x.k, x.v, r.out, r.lse, blocks)
                                 : attention_backward(x.grad, x.q, x.k, x.v, r.out, r.lse, blocks);
    EXPECT_EQ(g.dq.narrow(0, 10, 10).abs().max().item<float>(), 0.0F);
  }
  EXPECT_THROW(attention_forward(x.q, x.k, x.v, {{0, 10, 0, 10}, {5, 5, 10, 10}}),
               ModelError);  // queries shared
  EXPECT_THROW(attention_forward(x.q, x.k, x.v, {{0, 5, 0, 10}, {5, 5, 5, 10}}), ModelError);  // keys shared
  EXPECT_THROW(attention_forward(x.q, x.k, x.v, {{0, 5, 0, 6}}, {/*causal=*/true}),
               ModelError);                                                      // not square
  EXPECT_THROW(attention_forward(x.q, x.k, x.v, {{15, 10, 0, 6}}), ModelError);  // outside
}

}  // namespace
}  // namespace loom::kernels
