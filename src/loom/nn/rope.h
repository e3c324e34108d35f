// Rotary position embeddings: 2-D vision RoPE (Qwen2-VL ViT) and multimodal M-RoPE (Qwen2-VL LLM).
// All tables are computed in fp32; rotate_half convention (first half / second half pairs).
#pragma once
#include <ATen/ATen.h>

#include <vector>

namespace loom::nn {

// inv_freq[i] = 1 / theta^(2i/dim), i < dim/2.
at::Tensor rope_inverse_frequencies(int64_t dim, double theta);

// Per-patch (row, col) positions for images/videos given as grid_thw rows (t, h, w), in the
// 2x2 spatial-merge order the patch rows come in. Returns (sum t*h*w, 2) int64.
at::Tensor vision_patch_positions(const at::Tensor& grid_thw, int64_t merge_size);

// Vision RoPE angles for head_dim: (N, head_dim) = cat(f[row], f[col]) repeated twice, with f
// the inverse frequencies of dim head_dim/2.
at::Tensor vision_rope_angles(const at::Tensor& positions, int64_t head_dim, double theta);

// M-RoPE angles: position_ids (3, B, L) -> (B, L, head_dim); dims of section k of each half take
// their angle from axis k (temporal, height, width), sections given for half the head dim.
at::Tensor mrope_angles(const at::Tensor& position_ids, int64_t head_dim, double theta,
                        const std::vector<int64_t>& sections);

// x * cos + rotate_half(x) * sin, computed in fp32 and returned in x's dtype.
// x (..., L, heads, head_dim) with cos/sin broadcastable as (..., L, 1, head_dim).
at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

}  // namespace loom::nn
