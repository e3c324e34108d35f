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

// Queries [q_begin, q_begin + q_length) against keys [k_begin, k_begin + k_length): one block of a
// varlen problem whose queries and keys need not be the same tokens (ring attention pairs a rank's
// queries with another rank's keys). A causal or windowed block is square (q_length == k_length),
// its query i and key i the same position.
struct AttentionBlock {
  int64_t q_begin = 0, q_length = 0, k_begin = 0, k_length = 0;
};

// The blocks of cu_seqlens: each segment's tokens against themselves.
std::vector<AttentionBlock> segment_blocks(const std::vector<int64_t>& cu_seqlens);

// Attention over blocks without autograd, for callers that run their own backward pass (ring
// attention merges partial results and sends key/value gradients around the ring). q (Tq, Hq, D),
// k and v (Tk, Hkv, D); blocks must not share queries, nor keys. `out` (Tq, Hq, D) and `lse` (Hq,
// Tq) are fp32; a query in no block gets out 0 and lse -inf. The CPU kernel on CPU tensors, the
// composite elsewhere.
struct AttentionResult {
  at::Tensor out, lse;
};
AttentionResult attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const std::vector<AttentionBlock>& blocks, AttentionOptions options = {});
// The gradients of q, k and v (fp32, zero outside the blocks) given dout and the *final* out and lse
// of each query (FlashAttention-2's backward: P = exp(S - lse), delta = rowsum(dout * out)), so a
// block's share of a merged result is differentiated alone.
struct AttentionGrads {
  at::Tensor dq, dk, dv;
};
AttentionGrads attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                  const std::vector<AttentionBlock>& blocks, AttentionOptions options = {});
// The same two written with whole score matrices per block (any device; the reference in tests).
AttentionResult composite_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                            const std::vector<AttentionBlock>& blocks,
                                            AttentionOptions options = {});
AttentionGrads composite_attention_backward(const at::Tensor& dout, const at::Tensor& q, const at::Tensor& k,
                                            const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                            const std::vector<AttentionBlock>& blocks,
                                            AttentionOptions options = {});

// Differentiable in q, k and v. `lse`, when given, receives the log-sum-exp of each query's scores,
// (Hq, T) fp32 (what ring attention combines partial results with).
at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const std::vector<int64_t>& cu_seqlens, AttentionOptions options = {},
                           at::Tensor* lse = nullptr);

// The same function written with whole score matrices (matmul, mask, softmax, matmul) per segment.
at::Tensor composite_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const std::vector<int64_t>& cu_seqlens, AttentionOptions options = {});

}  // namespace loom::kernels
