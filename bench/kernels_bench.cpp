// Fused kernels against their composite references (Google Benchmark): attention forward +
// backward, causal, at seq 4096 and head_dim 128, and over 8 packed samples of the same total
// length (varlen: the work follows the sum of squared sample lengths). Counters: tokens/s, and the
// bytes each keeps besides its inputs and outputs (the composite's score and probability matrices;
// flash attention's per-query log-sum-exp and softmax correction, O(seq)).
//
//   build/loom_bench_kernels [--benchmark_filter=Attention]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "loom/kernels/attention.h"

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

}  // namespace

BENCHMARK_MAIN();
