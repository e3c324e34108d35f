// Scaled dot-product attention. With fused kernels on (features.fused_kernels, the default), segments
// of kFlashMinLength tokens or more run through kernels::flash_attention (tiled, online softmax,
// O(seq) extra memory, masked blocks skipped); shorter ones, and everything with fused kernels off,
// in the straightforward composite form (matmul, softmax in fp32, matmul), where equal-length
// segments batch into one product and beat per-tile calls.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "loom/nn/fused.h"
#include "loom/parallel/context/shard.h"

namespace loom::nn {

constexpr int64_t kFlashMinLength = 128;

// Attention restricted to segments [cu[i], cu[i+1]) of the token axis: bidirectional for the
// vision tower (one image or video frame each), causal within each segment for packed text (one
// sample each, so no token sees another sample). q (N, Hq, D), k and v (N, Hkv, D) with
// Hq % Hkv == 0 -> (N, Hq, D). Segments of equal length are batched together.
at::Tensor segment_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const std::vector<int64_t>& cu_seqlens, bool causal = false);

// Attention over a context-parallel shard's tokens: q (n, Hq, D), k and v (n, Hkv, D) this rank's
// slots -> (n, Hq, D). The Ulysses exchange gives each rank its ring shard for its share of the
// heads; over a ring of one rank segment_attention runs on it, over more ring attention.
at::Tensor context_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const parallel::ContextAttention& plan);

// Causal attention with grouped key/value heads.
// q (B, L, Hq, D), k and v (B, L, Hkv, D), Hq % Hkv == 0 -> (B, L, Hq, D).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Attention of a few new tokens over keys and values cached before them (decoding), in the composite
// form: q (B, Lq, Hq, D), k and v (B, Lk, Hkv, D), allowed (B, Lq, Lk) bool, true where a query may
// see a key (every query must see at least one) -> (B, Lq, Hq, D).
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& allowed);

}  // namespace loom::nn
