// Flash-style attention over packed rows (FlashAttention-2's algorithm, on the CPU): the keys are
// visited tile by tile with an online softmax, so no score matrix is ever held whole (extra memory
// O(tokens)); each segment of cu_seqlens attends only within itself, which skips every masked
// block outright (varlen: the cost follows the sum of squared segment lengths); GQA reads each
// key/value head for its group of query heads without repeating it in memory. The backward pass
// recomputes each tile's probabilities from the saved log-sum-exp.
//
// Layout: q (T, Hq, D), k and v (T, Hkv, D), Hq a multiple of Hkv; fp32 or bf16 (computed in
// fp32). composite_attention is the straightforward reference beside it.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace loom::kernels {

struct AttentionOptions {
  bool causal = false;
  double scale = 0;    // 0: 1/sqrt(D)
  int64_t window = 0;  // > 0: sliding window, each query sees the keys within window - 1 positions of
                       // it (behind it only, when causal); 0: the whole segment
};

// Differentiable in q, k and v. `lse`, when given, receives the log-sum-exp of each query's scores,
// (Hq, T) fp32 (what ring attention combines partial results with).
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& cu_seqlens, AttentionOptions options = {},
                           at::Tensor* lse = nullptr);

// The same function written with whole score matrices (matmul, mask, softmax, matmul) per segment.
at::Tensor composite_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, AttentionOptions options = {});

}  // namespace loom::kernels
