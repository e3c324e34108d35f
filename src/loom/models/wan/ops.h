// The pieces of Wan2.1's DiT arithmetic that Loom's nn/ does not have (yet): the float64 timestep
// sinusoid, the 3-D rotary embedding on interleaved channel pairs with one frequency table per axis,
// LayerNorm without affine, attention of queries over a key set of another length, and the two
// token layouts of a latent video (patch rows for the patch embedding, channel-innermost for the
// head). Candidates for nn/ once a second family needs them.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <utility>

namespace loom::models {

// The token grid of one latent video: frames, rows, columns after patching.
struct WanGrid {
  int64_t frames = 0, rows = 0, columns = 0;
  int64_t tokens() const { return frames * rows * columns; }
  bool operator==(const WanGrid& o) const {
    return frames == o.frames && rows == o.rows && columns == o.columns;
  }
};

// Wan's timestep embedding input: [cos(t w_0) .. cos(t w_{n-1}) | sin(t w_0) .. sin(t w_{n-1})] with
// n = dim / 2 and w_i = 10000^(-i / n), the angles t w_i in float64 (in float32 they are off by up to
// 3e-5 rad near t = 1000). timesteps [B] (any numeric dtype) -> [B, dim] float32.
at::Tensor wan_sinusoid(int64_t dim, const at::Tensor& timesteps);

// Rotary pairs of one head per axis (frame, row, column): with c = head_dim / 2 pairs, the rows and
// columns get c / 3 each and the frames the rest (head_dim 128: 22, 21, 21; 16: 4, 2, 2).
std::array<int64_t, 3> wan_rope_pairs(int64_t head_dim);

// Every token's (frame, row, column) index, frames slowest: (L, 3) int64.
at::Tensor wan_grid_positions(const WanGrid& grid);

// Rotation angles (L, head_dim / 2) float64 of positions (L, 3) int64: pair j of axis a (with c_a
// pairs) turns by position_a * theta^(-j / c_a), each axis its own frequency table. A position of
// max_positions or more is a ModelError (Wan's tables hold 1024).
at::Tensor wan_rope_angles(const at::Tensor& positions, int64_t head_dim, double theta = 10000.0,
                           int64_t max_positions = 1024);

// cos and sin of wan_rope_angles, each (L, 1, head_dim / 2) float32, computed from the float64 angles.
std::pair<at::Tensor, at::Tensor> wan_rope_tables(const at::Tensor& positions, int64_t head_dim,
                                                  double theta = 10000.0, int64_t max_positions = 1024);

// Rotary embedding on interleaved pairs (x[2j], x[2j+1]) -> (a cos - b sin, a sin + b cos), computed in
// float32 and returned in x's dtype (not nn::apply_rotary's first-half/second-half pairs).
// x (..., L, H, D), cos and sin (L, 1, D / 2) -> (..., L, H, D).
at::Tensor apply_rotary_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// LayerNorm over the last dimension without weight or bias, statistics and result in float32 whatever
// x's dtype. x (..., C) -> (..., C) float32.
at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps);

// softmax(q k^T / sqrt(D)) v over every key (no mask), the softmax in float32, in query chunks so the
// scores never exceed `max_score_elements`. q (B, Lq, H, D), k and v (B, Lk, H, D) -> (B, Lq, H, D).
at::Tensor cross_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t max_score_elements = int64_t{1} << 26);

// The token grid of latents [B, C, T, H, W]; ModelError unless T, H, W are multiples of the patch.
WanGrid latent_grid(const at::Tensor& latents, const std::array<int64_t, 3>& patch);

// A latent video's patches as rows, tokens frame-major then row then column, each row in the patch
// embedding's weight order [C_in][pt][ph][pw]. latents [B, C_in, T, H, W] (T, H, W multiples of the
// patch) -> [B, L, C_in * pt * ph * pw]; `grid` receives the token grid.
at::Tensor patchify(const at::Tensor& latents, const std::array<int64_t, 3>& patch, WanGrid* grid = nullptr);

// The head's tokens back to a video: tokens [B, L, pt * ph * pw * C] with the channel innermost
// (row element ((p * ph + q) * pw + r) * C + c) -> [B, C, f * pt, h * ph, w * pw].
at::Tensor unpatchify(const at::Tensor& tokens, const WanGrid& grid, const std::array<int64_t, 3>& patch,
                      int64_t channels);

// unpatchify's inverse: a video [B, C, T, H, W] in the head's token layout [B, L, pt * ph * pw * C]
// (a training target compared with the head's output without unpatchifying it).
at::Tensor head_tokens(const at::Tensor& video, const std::array<int64_t, 3>& patch);

}  // namespace loom::models
