// Scaled dot-product attention in its straightforward composite form (matmul, softmax in fp32,
// matmul). The fused kernels replace these behind the same signatures.
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace loom::nn {

// Attention restricted to segments [cu[i], cu[i+1]) of the token axis: bidirectional for the
// vision tower (one image or video frame each), causal within each segment for packed text (one
// sample each, so no token sees another sample). q (N, Hq, D), k and v (N, Hkv, D) with
// Hq % Hkv == 0 -> (N, Hq, D). Segments of equal length are batched together.
at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens, bool causal = false);

// Causal attention with grouped key/value heads.
// q (B, L, Hq, D), k and v (B, L, Hkv, D), Hq % Hkv == 0 -> (B, L, Hq, D).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace loom::nn
