// Fused kernels against their composite references (Google Benchmark): attention forward +
// backward, causal, at seq 4096 and head_dim 128, and over 8 packed samples of the same total
// length (varlen: the work follows the sum of squared sample lengths); RMSNorm, SwiGLU and the
// rotary embedding, forward + backward, on 8192 rows; the VAE's channel norm + SiLU on one
// activation; the LM head with its cross-entropy, chunked against whole logits; AdamW, one
// multi-tensor pass against the composite per tensor. Counters: tokens/s, and the bytes each
// keeps besides its inputs and outputs (the composite's score and probability matrices; flash
// attention's per-query log-sum-exp and softmax correction, O(seq)).
//
//   OPENBLAS_CORETYPE=SkylakeX build/loom_bench_kernels [--benchmark_filter=Attention]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "loom/kernels/adamw.h"
#include "loom/kernels/attention.h"
#include "loom/kernels/channel_norm.h"
#include "loom/kernels/cross_entropy.h"
#include "loom/kernels/delta_rule.h"
#include "loom/kernels/pointwise.h"

namespace {

using loom::kernels::AttentionOptions;

constexpr int64_t kTokens = 4096, kHeads = 2, kDim = 128;

std::vector<int64_t> segments(int64_t count) {
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < count; ++i) cu.push_back(cu.back() + kTokens / count);
  return cu;
}

template <bool Flash>
void Attention(benchmark::State& state) {
  const int64_t count = state.range(0);
  const auto cu = segments(count);
  at::manual_seed(0);
  auto q = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto k = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto v = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto grad = at::randn({kTokens, kHeads, kDim});
  for (auto _ : state) {
    auto out = Flash ? loom::kernels::flash_attention(q, k, v, cu, AttentionOptions{true})
                     : loom::kernels::composite_attention(q, k, v, cu, AttentionOptions{true});
    out.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
    q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
  }
  const double length = static_cast<double>(kTokens / count);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
  // Composite: scores and probabilities of every segment's heads (kept for backward), fp32.
  // Flash: the log-sum-exp and delta per query and head, fp32.
  state.counters["extra_bytes"] =
      Flash ? 2.0 * kTokens * kHeads * 4 : 2.0 * count * kHeads * length * length * 4;
}

BENCHMARK_TEMPLATE(Attention, true)
    ->Name("Attention/flash/causal/segments")
    ->Arg(1)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_TEMPLATE(Attention, false)
    ->Name("Attention/composite/causal/segments")
    ->Arg(1)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);

// Causal sliding-window attention over one 4096-token sample, forward + backward: the work
// follows tokens x window, so a 512 window costs about a quarter of full causal attention.
template <bool Flash>
void WindowAttention(benchmark::State& state) {
  const int64_t window = state.range(0);
  at::manual_seed(0);
  auto q = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto k = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto v = at::randn({kTokens, kHeads, kDim}).set_requires_grad(true);
  auto grad = at::randn({kTokens, kHeads, kDim});
  const AttentionOptions options{true, 0, window};
  for (auto _ : state) {
    auto out = Flash ? loom::kernels::flash_attention(q, k, v, {0, kTokens}, options)
                     : loom::kernels::composite_attention(q, k, v, {0, kTokens}, options);
    out.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
    q.mutable_grad() = k.mutable_grad() = v.mutable_grad() = at::Tensor();
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_TEMPLATE(WindowAttention, true)
    ->Name("Attention/flash/causal/window")
    ->Arg(512)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(WindowAttention, false)
    ->Name("Attention/composite/causal/window")
    ->Arg(512)
    ->Unit(benchmark::kMillisecond);

// The gated delta rule (Qwen3.5's linear attention), forward + backward, at 4096 tokens, 2 key and
// 4 value heads of 128, in one sample and over 8 packed ones: the fused kernel against the chunked
// composite. extra_bytes: the fused kernel's state checkpoints (one per 64 tokens and head).
template <bool Fused>
void DeltaRule(benchmark::State& state) {
  const auto cu = segments(state.range(0));
  constexpr int64_t kKeyHeads = 2, kValueHeads = 4;
  at::manual_seed(0);
  const auto unit_rows = [] {
    const at::Tensor x = at::randn({kTokens, kKeyHeads, kDim});
    return (x / x.norm(2, -1, true)).set_requires_grad(true);
  };
  auto q = unit_rows(), k = unit_rows();
  auto v = at::randn({kTokens, kValueHeads, kDim}).set_requires_grad(true);
  auto g = (-at::softplus(at::randn({kTokens, kValueHeads})) * 0.5).set_requires_grad(true);
  auto beta = at::sigmoid(at::randn({kTokens, kValueHeads})).set_requires_grad(true);
  auto grad = at::randn({kTokens, kValueHeads, kDim});
  for (auto _ : state) {
    auto result = Fused ? loom::kernels::delta_rule(q, k, v, g, beta, cu)
                        : loom::kernels::composite_delta_rule(q, k, v, g, beta, cu);
    result.out.backward(grad);
    benchmark::DoNotOptimize(q.grad().data_ptr());
    for (auto* x : {&q, &k, &v, &g, &beta}) x->mutable_grad() = at::Tensor();
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kTokens), benchmark::Counter::kIsIterationInvariantRate);
  if (Fused)
    state.counters["extra_bytes"] = (kTokens / 64.0 + state.range(0)) * kValueHeads * kDim * kDim * 4;
}

BENCHMARK_TEMPLATE(DeltaRule, true)
    ->Name("DeltaRule/fused/segments")
    ->Arg(1)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(DeltaRule, false)
    ->Name("DeltaRule/composite/segments")
    ->Arg(1)
    ->Arg(8)
    ->Unit(benchmark::kMillisecond);

// Row-wise kernels, forward + backward, fused against composite. Counters: bytes_per_s counts one
// read of each input and one write of each output per pass (what a single fused pass moves).
constexpr int64_t kRows = 8192, kWidth = 1024;

template <bool Fused>
void RmsNorm(benchmark::State& state) {
  at::manual_seed(0);
  auto x = at::randn({kRows, kWidth}).set_requires_grad(true);
  auto w = (at::rand({kWidth}) + 0.5).set_requires_grad(true);
  auto grad = at::randn({kRows, kWidth});
  for (auto _ : state) {
    auto y = Fused ? loom::kernels::rms_norm(x, w, 1e-6) : loom::kernels::rms_norm_composite(x, w, 1e-6);
    y.backward(grad);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad() = w.mutable_grad() = at::Tensor();
  }
  // Forward reads x, writes y; backward reads x and dy, writes dx.
  state.counters["bytes_per_s"] =
      benchmark::Counter(5.0 * kRows * kWidth * 4, benchmark::Counter::kIsIterationInvariantRate);
}

// LayerNorm: Loom's fused kernel (0), the composite (1), ATen's native layer_norm (2), which is
// also one fused pass and which nn::LayerNorm uses.
template <int Kind>
void LayerNorm(benchmark::State& state) {
  at::manual_seed(0);
  auto x = at::randn({kRows, kWidth}).set_requires_grad(true);
  auto w = (at::rand({kWidth}) + 0.5).set_requires_grad(true);
  auto b = at::randn({kWidth}).set_requires_grad(true);
  auto grad = at::randn({kRows, kWidth});
  for (auto _ : state) {
    auto y = Kind == 0   ? loom::kernels::layer_norm(x, w, b, 1e-6)
             : Kind == 1 ? loom::kernels::layer_norm_composite(x, w, b, 1e-6)
                         : at::layer_norm(x, {kWidth}, w, b, 1e-6);
    y.backward(grad);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad() = w.mutable_grad() = b.mutable_grad() = at::Tensor();
  }
  state.counters["bytes_per_s"] =
      benchmark::Counter(5.0 * kRows * kWidth * 4, benchmark::Counter::kIsIterationInvariantRate);
}

template <bool Fused>
void Swiglu(benchmark::State& state) {
  at::manual_seed(0);
  auto g = at::randn({kRows, kWidth}).set_requires_grad(true);
  auto u = at::randn({kRows, kWidth}).set_requires_grad(true);
  auto grad = at::randn({kRows, kWidth});
  for (auto _ : state) {
    auto y = Fused ? loom::kernels::swiglu(g, u) : loom::kernels::swiglu_composite(g, u);
    y.backward(grad);
    benchmark::DoNotOptimize(g.grad().data_ptr());
    g.mutable_grad() = u.mutable_grad() = at::Tensor();
  }
  // Forward reads g, u, writes y; backward reads g, u, dy, writes dg, du.
  state.counters["bytes_per_s"] =
      benchmark::Counter(8.0 * kRows * kWidth * 4, benchmark::Counter::kIsIterationInvariantRate);
}

// Wan's VAE norm + SiLU over channels: [2, 8, 5, 48, 48] fp32, a residual block's input at the
// default video VAE's first level, 2 clips a step.
template <bool Fused>
void ChannelRmsNormSilu(benchmark::State& state) {
  at::manual_seed(0);
  auto x = at::randn({2, 8, 5, 48, 48}).set_requires_grad(true);
  auto gamma = (at::rand({8, 1, 1, 1}) + 0.5).set_requires_grad(true);
  auto grad = at::randn(x.sizes());
  for (auto _ : state) {
    auto y = Fused ? loom::kernels::channel_rms_norm(x, gamma, true)
                   : loom::kernels::channel_rms_norm_composite(x, gamma, true);
    y.backward(grad);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad() = gamma.mutable_grad() = at::Tensor();
  }
  state.counters["bytes_per_s"] =
      benchmark::Counter(5.0 * x.numel() * 4, benchmark::Counter::kIsIterationInvariantRate);
}

template <bool Fused>
void Rotary(benchmark::State& state) {
  at::manual_seed(0);
  constexpr int64_t kHeadsRope = 8, kDimRope = 128;
  auto x = at::randn({kRows, kHeadsRope, kDimRope}).set_requires_grad(true);
  auto half = at::rand({kRows, 1, kDimRope / 2}) * 6;
  auto angle = at::cat({half, half}, -1);
  auto cos = angle.cos(), sin = angle.sin();
  auto grad = at::randn({kRows, kHeadsRope, kDimRope});
  for (auto _ : state) {
    auto y = Fused ? loom::kernels::rotary(x, cos, sin) : loom::kernels::rotary_composite(x, cos, sin);
    y.backward(grad);
    benchmark::DoNotOptimize(x.grad().data_ptr());
    x.mutable_grad() = at::Tensor();
  }
  state.counters["bytes_per_s"] = benchmark::Counter(4.0 * kRows * kHeadsRope * kDimRope * 4,
                                                     benchmark::Counter::kIsIterationInvariantRate);
}

// LM head + cross-entropy over 4096 tokens, 1024 wide, a 32k vocabulary: the composite holds the
// (tokens, vocab) logits and their gradient; the chunked form one chunk of 1024 rows.
template <bool Fused>
void LinearCrossEntropy(benchmark::State& state) {
  constexpr int64_t kTokensCe = 4096, kHidden = 1024, kVocab = 32000, kChunk = 1024;
  at::manual_seed(0);
  auto hidden = at::randn({kTokensCe, kHidden}).set_requires_grad(true);
  auto weight = (at::randn({kVocab, kHidden}) * 0.02).set_requires_grad(true);
  auto labels = at::randint(0, kVocab, {kTokensCe}, at::kLong);
  for (auto _ : state) {
    auto loss = Fused ? loom::kernels::linear_cross_entropy_sum(hidden, weight, labels, -100, kChunk)
                      : loom::kernels::linear_cross_entropy_sum_composite(hidden, weight, labels);
    loss.backward();
    benchmark::DoNotOptimize(hidden.grad().data_ptr());
    hidden.mutable_grad() = weight.mutable_grad() = at::Tensor();
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(kTokensCe), benchmark::Counter::kIsIterationInvariantRate);
  // Logits and their gradient (composite) against one chunk's (fused), fp32.
  state.counters["logit_bytes"] = Fused ? 1.0 * kChunk * kVocab * 4 : 2.0 * kTokensCe * kVocab * 4;
}

// AdamW over 10.5M fp32 parameters in 150 tensors of mixed sizes (like a small model's), one
// multi-tensor pass against the composite per tensor.
template <bool Fused>
void AdamW(benchmark::State& state) {
  at::manual_seed(0);
  std::vector<loom::kernels::AdamWTensor> tensors;
  int64_t total = 0;
  for (int64_t i = 0; i < 150; ++i) {
    const int64_t n = i % 3 == 0 ? 1024 : 100000 + 1000 * i;
    tensors.push_back({at::randn({n}), at::randn({n}), at::zeros({n}), at::zeros({n}), i % 3 != 0, {}});
    total += n;
  }
  loom::kernels::AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (auto _ : state) {
    if (Fused) {
      loom::kernels::adamw_step(tensors, h);
    } else {
      for (const auto& t : tensors) loom::kernels::adamw_step_composite(t, h);
    }
    benchmark::DoNotOptimize(tensors[0].weight.data_ptr());
  }
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
}

// The same tensors as bf16 parameters with bf16 gradients: the fp32 master a separate tensor, or
// split into the parameter and a 16-bit residual (features.reuse_fp32_param).
template <bool Split>
void AdamWBf16(benchmark::State& state) {
  at::manual_seed(0);
  std::vector<loom::kernels::AdamWTensor> tensors;
  std::vector<std::vector<int64_t>> ties(150);
  int64_t total = 0;
  for (int64_t i = 0; i < 150; ++i) {
    const int64_t n = i % 3 == 0 ? 1024 : 100000 + 1000 * i;
    const at::Tensor w = at::randn({n});
    loom::kernels::AdamWTensor t{
        w, at::randn({n}).to(at::kBFloat16), at::zeros({n}), at::zeros({n}), i % 3 != 0, w.to(at::kBFloat16)};
    if (Split) {
      t.weight = at::Tensor();
      t.residual = at::zeros({n}, at::kShort);  // as if the master were the parameter
      t.ties = &ties[static_cast<size_t>(i)];
    }
    tensors.push_back(t);
    total += n;
  }
  loom::kernels::AdamWHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1;
  for (auto _ : state) {
    loom::kernels::adamw_step(tensors, h);
    benchmark::DoNotOptimize(tensors[0].bf16_param.data_ptr());
  }
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(total), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_TEMPLATE(AdamW, true)->Name("AdamW/multi_tensor")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(AdamWBf16, false)->Name("AdamW/bf16_master")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(AdamWBf16, true)->Name("AdamW/bf16_split_master")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(AdamW, false)->Name("AdamW/composite")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(LinearCrossEntropy, true)
    ->Name("LinearCrossEntropy/chunked")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(LinearCrossEntropy, false)
    ->Name("LinearCrossEntropy/composite")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(RmsNorm, true)->Name("RmsNorm/fused")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(RmsNorm, false)->Name("RmsNorm/composite")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(LayerNorm, 0)->Name("LayerNorm/fused")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(LayerNorm, 1)->Name("LayerNorm/composite")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(LayerNorm, 2)->Name("LayerNorm/aten")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Swiglu, true)->Name("Swiglu/fused")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Swiglu, false)->Name("Swiglu/composite")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(ChannelRmsNormSilu, true)->Name("ChannelRmsNormSilu/fused")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(ChannelRmsNormSilu, false)
    ->Name("ChannelRmsNormSilu/composite")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Rotary, true)->Name("Rotary/fused")->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Rotary, false)->Name("Rotary/composite")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
