// Qwen3.5's linear-attention layer, Gated DeltaNet, with HuggingFace's parameter names
// (linear_attn.*): the input projections (in_proj_qkv, in_proj_z, in_proj_b, in_proj_a), the causal
// depthwise convolution of q, k and v with SiLU (conv1d), L2-normalised q and k, the decay
// g = -exp(A_log) * softplus(a + dt_bias) and write strength beta = sigmoid(b), the gated delta rule
// (kernels/delta_rule.h), the output's RMSNorm gated by SiLU(z) (norm) and out_proj. Packed rows:
// the convolution and the delta rule both start afresh at every sample boundary of cu_seqlens.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/parallel/context/shard.h"
#include "loom/parallel/tensor.h"

namespace loom::models::qwen3_5 {

struct GatedDeltaNetConfig {
  int64_t hidden_size = 0;
  int64_t num_key_heads = 0, num_value_heads = 0;  // linear_num_key_heads, linear_num_value_heads
  int64_t key_head_dim = 0, value_head_dim = 0;    // linear_key_head_dim, linear_value_head_dim
  int64_t conv_kernel = 4;                         // linear_conv_kernel_dim
  double rms_norm_eps = 1e-6;
  int64_t key_dim() const { return num_key_heads * key_head_dim; }
  int64_t value_dim() const { return num_value_heads * value_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The causal depthwise convolution over packed rows: x (T, C), weight (C, K) -> (T, C) with
// out[t, c] = sum_j weight[c, j] x[t - (K - 1) + j, c], the rows before t's sample taken as zero
// (transformers' causal_conv1d_fn, per sample). No activation.
at::Tensor causal_conv1d(const at::Tensor& x, const at::Tensor& weight,
                         const std::vector<int64_t>& cu_seqlens);

// The gated output norm: x / sqrt(mean(x^2) + eps) over the last dimension in fp32, cast back to x's
// dtype, times weight, times SiLU(z) in fp32, cast back (transformers' Qwen3_5RMSNormGated; the
// weight is the scale itself, not an offset from one).
at::Tensor gated_rms_norm(const at::Tensor& x, const at::Tensor& z, const at::Tensor& weight, double eps);

// x * rsqrt(sum(x^2) + eps) over the last dimension, in fp32 (the delta rule's q and k).
at::Tensor l2_normalize(const at::Tensor& x, double eps = 1e-6);

// Under tensor parallelism each rank holds its share of the key heads and of the value heads (the
// value heads that read each key head with it): its rows of q, k and v in in_proj_qkv and conv1d
// (three blocks of unequal widths, each split), of z, b and a, of A_log and dt_bias, and its columns
// of out_proj; the gated norm's weight is whole, applied to this rank's heads.
// Context parallelism over a ring of ranks (parallel/context/shard.h: each sequence cut into 2 x ring
// chunks, ring rank r holding chunks r and 2 ring - 1 - r). The recurrence's state must pass from
// chunk to chunk in order, across ranks; it does so in parallel:
//   1. each rank runs its chunks from a zero state, keeping each chunk's final state S0_c and its
//      transition M_c (Dk x Dk per head: the state is linear in the one it starts from,
//      S_end = M_c S_start + S0_c). Both come from one pass, M_c as the state of extra value columns
//      that start as the identity and are written nothing (v = 0);
//   2. one all-gather over the ring gives every rank every chunk's (S0_c, M_c) (2 ring chunks' states,
//      not tokens);
//   3. each rank scans the chunks before each of its own, S_start = M_{c-1} S_start + S0_{c-1}, and
//      runs its chunks again from those states: the outputs are then exact.
// Every rank works at once; the price is the delta rule run twice (once with Dv + Dk value columns).
// The convolution's first K - 1 outputs of a chunk read the K - 1 rows before it, which come by a
// second all-gather (each chunk's last K - 1 rows). Backward runs through the same steps, the
// all-gathers' gradients reduce-scattered back to their chunks.
struct LinearContextParallel {
  std::shared_ptr<dist::Comm> ring;
  int64_t pieces = 0;            // chunks per rank (every ring rank holds as many)
  std::vector<int64_t> cu;       // this rank's tokens: each chunk a segment, then the padding's (if any)
  std::vector<int64_t> lengths;  // each chunk's tokens (padding at a sequence's end included)
  // For each of this rank's chunks, the chunks before it in its sequence, nearest first, as indexes
  // into every ring rank's chunks in rank order (rank * pieces + chunk).
  std::vector<std::vector<int64_t>> before;
};

// The plan for a causal shard of a ring (Ulysses degree 1; ModelError otherwise).
LinearContextParallel linear_context_parallel(const parallel::ContextShard& shard);

// Generation's state of one linear-attention layer, for `rows` samples that are the first `rows`
// segments of the pass's cu_seqlens (a prefill) or its first `rows` tokens, one a sample (a step):
// the convolution's last K - 1 input rows (rows, K - 1, C) and the delta rule's state
// (rows, Hv, Dk, Dv) fp32. A prefill sets them; a step reads them, runs one token, and moves them on.
struct LinearDecoding {
  int64_t rows = 0;
  bool step = false;
  at::Tensor conv, state;
};

class GatedDeltaNet : public torch::nn::Module, public parallel::Sharded {
 public:
  GatedDeltaNet(const GatedDeltaNetConfig& config, const parallel::ParamOptions& options);
  // x (1, T, hidden), packed samples [cu[i], cu[i+1]) -> (1, T, hidden). `fused`: the delta rule's
  // fused kernel (kernels::delta_rule) rather than its composite.
  // `cp`: the tokens are this rank's context-parallel shard, run as the plan says (cu_seqlens unused).
  // `decoding`: generation's state, filled by a prefill or read and moved on by a step (whose tokens
  // after the first `rows`, padding, come out as zeros).
  at::Tensor forward(const at::Tensor& x, const std::vector<int64_t>& cu_seqlens, bool fused = true,
                     const LinearContextParallel* cp = nullptr, LinearDecoding* decoding = nullptr) const;
  std::map<std::string, parallel::ShardLayout> layouts() const override;  // A_log, dt_bias

  GatedDeltaNetConfig config;
  GatedDeltaNetConfig local;  // this rank's heads
  std::shared_ptr<parallel::ColumnParallelLinear> in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;
  std::shared_ptr<parallel::ShardedWeight> conv1d, norm;  // conv1d.weight (conv_dim, 1, K); norm.weight (dv)
  at::Tensor conv_weight, norm_weight, dt_bias, A_log;
  std::shared_ptr<parallel::RowParallelLinear> out_proj;

 private:
  parallel::TensorParallelGroup group_;
};

}  // namespace loom::models::qwen3_5
