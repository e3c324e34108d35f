// The LM head and its cross-entropy fused over chunks of tokens: logits = hidden W^T and
// -log softmax(logits)[label] are computed a chunk of rows at a time, so the (tokens, vocab)
// logits are never held whole (extra memory O(chunk x vocab) instead of O(tokens x vocab), which
// for a 151k vocabulary is most of a step's activations). Each chunk's logits become that chunk's
// share of the gradients of hidden and W as soon as they are computed (when a gradient is
// wanted), so backward only scales them: the same three products as the composite form (whole
// logits, ATen's cross-entropy), which is beside it as the reference.
#pragma once
#include <ATen/ATen.h>

namespace loom::kernels {

// Sum over rows whose label is not ignore_index of -log softmax(hidden W^T)[label].
// hidden (N, H) and weight (V, H), fp32 or bf16 (the products in hidden's dtype, the softmax in
// fp32); labels (N) int64. Differentiable in hidden and weight.
at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                    const at::Tensor& labels, int64_t ignore_index = -100,
                                    int64_t chunk_rows = 1024);
at::Tensor linear_cross_entropy_sum_composite(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, int64_t ignore_index = -100);

}  // namespace loom::kernels
