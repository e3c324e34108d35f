// Loom's CUDA kernels against their composite references on the GPU (Google Benchmark), through
// the public entry points (autograd, forward + backward), bf16: causal attention at seq 4096 with
// 16 heads of 128, whole and as 8 packed samples; RMSNorm on 8192 x 4096; SwiGLU on 8192 x 11008;
// the rotary embedding on 8192 positions x 32 heads x 128; the gated delta rule at 4096 tokens with
// 32 value heads of 128. Each iteration ends with a device synchronisation, so times are wall times
// of the GPU work. Needs a CUDA build and a GPU:
//
//   build-gpu/loom_bench_kernels_cuda [--benchmark_filter=Attention]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/cuda.h>

#include <cstdio>
#include <vector>

#include "loom/kernels/attention.h"
#include "loom/kernels/cuda/ops.h"
#include "loom/kernels/delta_rule.h"
#include "loom/kernels/pointwise.h"

namespace {

using loom::kernels::AttentionOptions;

at::Tensor input(at::IntArrayRef shape, bool grad = true) {
  return at::randn(shape, at::TensorOptions().dtype(at::kBFloat16).device(loom::kernels::cuda::device()))
      .set_requires_grad(grad);
}

void clear_grads(std::initializer_list<at::Tensor*> tensors) {
  for (at::Tensor* t : tensors) t->mutable_grad() = at::Tensor();
}

void count_tokens(benchmark::State& state, int64_t tokens) {
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

constexpr int64_t kTokens = 4096, kHeads = 16, kDim = 128;

template <bool Flash>
void Attention(benchmark::State& state) {
  const int64_t count = state.range(0);
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < count; ++i) cu.push_back(cu.back() + kTokens / count);
  at::manual_seed(0);
  at::Tensor q = input({kTokens, kHeads, kDim}), k = input({kTokens, kHeads, kDim}),
             v = input({kTokens, kHeads, kDim});
  const at::Tensor grad = input({kTokens, kHeads, kDim}, false);
  for (auto _ : state) {
    at::Tensor out = Flash ? loom::kernels::flash_attention(q, k, v, cu, AttentionOptions{true})
                           : loom::kernels::composite_attention(q, k, v, cu, AttentionOptions{true});
    out.backward(grad);
    torch::cuda::synchronize();
    clear_grads({&q, &k, &v});
  }
  count_tokens(state, kTokens);
  // The work of causal attention, forward (2 products) and backward (5), over the visible half of
  // each segment's scores: 7 * 2 * D * H * sum(len^2) / 2 (the usual FlashAttention count, which
  // leaves out the recomputed scores).
  const double segment = static_cast<double>(kTokens / count);
  state.counters["TFLOP_per_s"] =
      benchmark::Counter(7.0 * kDim * kHeads * segment * segment * static_cast<double>(count) * 1e-12,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_TEMPLATE(Attention, true)
    ->Name("Attention/flash/causal/segments")
    ->Arg(1)
    ->Arg(8)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Attention, false)
    ->Name("Attention/composite/causal/segments")
    ->Arg(1)
    ->Arg(8)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

constexpr int64_t kRows = 8192;

template <bool Fused>
void RmsNorm(benchmark::State& state) {
  at::Tensor x = input({kRows, 4096}), w = input({4096});
  const at::Tensor grad = input({kRows, 4096}, false);
  for (auto _ : state) {
    at::Tensor y =
        Fused ? loom::kernels::rms_norm(x, w, 1e-6) : loom::kernels::rms_norm_composite(x, w, 1e-6);
    y.backward(grad);
    torch::cuda::synchronize();
    clear_grads({&x, &w});
  }
  count_tokens(state, kRows);
}
BENCHMARK_TEMPLATE(RmsNorm, true)->Name("RmsNorm/fused")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(RmsNorm, false)->Name("RmsNorm/composite")->UseRealTime()->Unit(benchmark::kMillisecond);

template <bool Fused>
void Swiglu(benchmark::State& state) {
  at::Tensor gate = input({kRows, 11008}), up = input({kRows, 11008});
  const at::Tensor grad = input({kRows, 11008}, false);
  for (auto _ : state) {
    at::Tensor y = Fused ? loom::kernels::swiglu(gate, up) : loom::kernels::swiglu_composite(gate, up);
    y.backward(grad);
    torch::cuda::synchronize();
    clear_grads({&gate, &up});
  }
  count_tokens(state, kRows);
}
BENCHMARK_TEMPLATE(Swiglu, true)->Name("Swiglu/fused")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Swiglu, false)->Name("Swiglu/composite")->UseRealTime()->Unit(benchmark::kMillisecond);

template <bool Fused>
void Rotary(benchmark::State& state) {
  at::Tensor x = input({kRows, 32, 128});
  const at::Tensor angles = at::rand({kRows, 1, 128}, x.options().dtype(at::kFloat)) * 6;
  const at::Tensor cos = angles.cos(), sin = angles.sin(), grad = input({kRows, 32, 128}, false);
  for (auto _ : state) {
    at::Tensor y = Fused ? loom::kernels::rotary(x, cos, sin) : loom::kernels::rotary_composite(x, cos, sin);
    y.backward(grad);
    torch::cuda::synchronize();
    clear_grads({&x});
  }
  count_tokens(state, kRows);
}
BENCHMARK_TEMPLATE(Rotary, true)->Name("Rotary/fused")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(Rotary, false)->Name("Rotary/composite")->UseRealTime()->Unit(benchmark::kMillisecond);

// The gated delta rule at Qwen3.5's linear-attention shape (16 key and 32 value heads of 128),
// bf16, 4096 tokens whole and as 8 packed samples: the CUDA kernel against the chunked composite.
template <bool Fused>
void DeltaRule(benchmark::State& state) {
  const int64_t count = state.range(0);
  std::vector<int64_t> cu{0};
  for (int64_t i = 0; i < count; ++i) cu.push_back(cu.back() + kTokens / count);
  constexpr int64_t kKeyHeads = 16, kValueHeads = 32;
  at::manual_seed(0);
  const auto unit_rows = [] {
    const at::Tensor x = input({kTokens, kKeyHeads, kDim}, false).to(at::kFloat);
    return (x / x.norm(2, -1, true)).to(at::kBFloat16).set_requires_grad(true);
  };
  at::Tensor q = unit_rows(), k = unit_rows(), v = input({kTokens, kValueHeads, kDim});
  at::Tensor g = (-at::softplus(input({kTokens, kValueHeads}, false)) * 0.5).set_requires_grad(true);
  at::Tensor beta = at::sigmoid(input({kTokens, kValueHeads}, false)).set_requires_grad(true);
  const at::Tensor grad = input({kTokens, kValueHeads, kDim}, false);
  for (auto _ : state) {
    auto result = Fused ? loom::kernels::delta_rule(q, k, v, g, beta, cu)
                        : loom::kernels::composite_delta_rule(q, k, v, g, beta, cu);
    result.out.backward(grad);
    torch::cuda::synchronize();
    clear_grads({&q, &k, &v, &g, &beta});
  }
  count_tokens(state, kTokens);
}
BENCHMARK_TEMPLATE(DeltaRule, true)
    ->Name("DeltaRule/cuda/segments")
    ->Arg(1)
    ->Arg(8)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(DeltaRule, false)
    ->Name("DeltaRule/composite/segments")
    ->Arg(1)
    ->Arg(8)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  if (loom::kernels::cuda::emulated() || !torch::cuda::is_available()) {
    std::fprintf(stderr,
                 "loom_bench_kernels_cuda: needs a CUDA build of Loom (libtorch with CUDA, nvcc) and a GPU; "
                 "this build runs the CUDA kernels only under the CPU emulator, for tests\n");
    return 2;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
