#include "loom/models/wan/ops.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "loom/util/errors.h"

namespace loom::models {

at::Tensor wan_sinusoid(int64_t dim, const at::Tensor& timesteps) {
  if (dim <= 0 || dim % 2)
    throw ModelError(fmt::format("Wan timestep sinusoid: dim must be positive and even, got {}", dim));
  if (timesteps.dim() != 1)
    throw ModelError(
        fmt::format("Wan timesteps: expected [B], got [{}]", fmt::join(timesteps.sizes(), ", ")));
  const int64_t half = dim / 2;
  std::vector<double> frequencies(half);
  for (int64_t i = 0; i < half; ++i)
    frequencies[i] = std::pow(10000.0, -static_cast<double>(i) / static_cast<double>(half));
  const at::Tensor w = at::tensor(frequencies, at::kDouble).to(timesteps.device());   // [half]
  const at::Tensor angles = timesteps.to(at::kDouble).unsqueeze(1) * w.unsqueeze(0);  // [B, half] fp64
  return at::cat({at::cos(angles), at::sin(angles)}, 1).to(at::kFloat);               // [B, dim]
}

std::array<int64_t, 3> wan_rope_pairs(int64_t head_dim) {
  const int64_t c = head_dim / 2;
  return {c - 2 * (c / 3), c / 3, c / 3};
}

at::Tensor wan_grid_positions(const WanGrid& grid) {
  auto axis = [](int64_t n) { return at::arange(n, at::kLong); };
  const auto f = axis(grid.frames).view({-1, 1, 1}).expand({grid.frames, grid.rows, grid.columns});
  const auto h = axis(grid.rows).view({1, -1, 1}).expand({grid.frames, grid.rows, grid.columns});
  const auto w = axis(grid.columns).view({1, 1, -1}).expand({grid.frames, grid.rows, grid.columns});
  return at::stack({f.reshape(-1), h.reshape(-1), w.reshape(-1)}, 1);  // (L, 3)
}

at::Tensor wan_rope_angles(const at::Tensor& positions, int64_t head_dim, double theta,
                           int64_t max_positions) {
  if (positions.dim() != 2 || positions.size(1) != 3)
    throw ModelError(
        fmt::format("Wan rotary positions: expected (L, 3), got ({})", fmt::join(positions.sizes(), ", ")));
  if (head_dim <= 0 || head_dim % 2)
    throw ModelError(
        fmt::format("Wan rotary embedding: head_dim must be positive and even, got {}", head_dim));
  const at::Tensor where = positions.to(at::kLong).cpu();
  if (where.numel() > 0) {
    const int64_t low = where.min().item<int64_t>(), high = where.max().item<int64_t>();
    if (low < 0 || high >= max_positions)
      throw ModelError(fmt::format(
          "Wan rotary embedding: position {} is outside the table of {} positions per axis (frames, rows and "
          "columns after patching must be at most {})",
          low < 0 ? low : high, max_positions, max_positions));
  }
  // One frequency per pair, each axis with its own table: theta^(-2j / D_a), D_a = 2 c_a.
  const auto pairs = wan_rope_pairs(head_dim);
  std::vector<double> frequencies;
  std::vector<int64_t> axis_of;
  for (int64_t a = 0; a < 3; ++a) {
    const double width = 2.0 * static_cast<double>(pairs[a]);
    for (int64_t j = 0; j < pairs[a]; ++j) {
      frequencies.push_back(1.0 / std::pow(theta, 2.0 * static_cast<double>(j) / width));
      axis_of.push_back(a);
    }
  }
  const at::Tensor w = at::tensor(frequencies, at::kDouble);  // (D/2)
  const at::Tensor per_pair =
      where.index_select(1, at::tensor(axis_of, at::kLong)).to(at::kDouble);  // (L, D/2)
  return (per_pair * w.unsqueeze(0)).to(positions.device());                  // (L, D/2) float64
}

std::pair<at::Tensor, at::Tensor> wan_rope_tables(const at::Tensor& positions, int64_t head_dim, double theta,
                                                  int64_t max_positions) {
  const at::Tensor angles = wan_rope_angles(positions, head_dim, theta, max_positions).unsqueeze(1);
  return {at::cos(angles).to(at::kFloat), at::sin(angles).to(at::kFloat)};  // (L, 1, D/2) each
}

at::Tensor apply_rotary_interleaved(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t d = x.size(-1);
  if (d % 2 || cos.size(-1) * 2 != d)
    throw ModelError(fmt::format("Wan rotary embedding: {} channels per head against tables of {} pairs", d,
                                 cos.size(-1)));
  std::vector<int64_t> paired = x.sizes().vec();
  paired.back() = d / 2;
  paired.push_back(2);
  const at::Tensor x32 = x.to(at::kFloat).reshape(paired);  // (..., L, H, D/2, 2)
  const at::Tensor a = x32.select(-1, 0), b = x32.select(-1, 1);
  const at::Tensor even = a * cos - b * sin;  // (..., L, H, D/2)
  const at::Tensor odd = a * sin + b * cos;
  return at::stack({even, odd}, -1).reshape(x.sizes()).to(x.scalar_type());
}

at::Tensor layer_norm_no_affine(const at::Tensor& x, double eps) {
  return at::layer_norm(x.to(at::kFloat), {x.size(-1)}, {}, {}, eps);
}

at::Tensor cross_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           int64_t max_score_elements) {
  if (q.dim() != 4 || k.dim() != 4 || v.sizes() != k.sizes() || q.size(0) != k.size(0) ||
      q.size(2) != k.size(2) || q.size(3) != k.size(3))
    throw ModelError(
        fmt::format("cross_attention: q ({}) against k ({}) and v ({}); expected (B, Lq, H, D) and "
                    "(B, Lk, H, D)",
                    fmt::join(q.sizes(), ", "), fmt::join(k.sizes(), ", "), fmt::join(v.sizes(), ", ")));
  const int64_t batch = q.size(0), queries = q.size(1), heads = q.size(2), keys = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  const at::Tensor kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // (B, H, Lk, D)
  const int64_t per_query = std::max<int64_t>(1, batch * heads * keys);
  const int64_t chunk = std::max<int64_t>(1, std::min(queries, max_score_elements / per_query));
  std::vector<at::Tensor> outputs;
  for (int64_t start = 0; start < queries; start += chunk) {
    const at::Tensor qh = q.narrow(1, start, std::min(chunk, queries - start)).transpose(1, 2);  // (B,H,c,D)
    const at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) * scale;                      // (B,H,c,Lk)
    const at::Tensor probabilities = at::softmax(scores, -1, at::kFloat).to(q.scalar_type());
    outputs.push_back(at::matmul(probabilities, vh).transpose(1, 2));  // (B, c, H, D)
  }
  return outputs.size() == 1 ? outputs[0].contiguous() : at::cat(outputs, 1);
}

namespace {

WanGrid grid_of(const at::Tensor& video, const std::array<int64_t, 3>& patch, const char* what) {
  if (video.dim() != 5)
    throw ModelError(
        fmt::format("Wan {}: expected [B, C, T, H, W], got [{}]", what, fmt::join(video.sizes(), ", ")));
  for (int64_t a = 0; a < 3; ++a)
    if (video.size(2 + a) % patch[a])
      throw ModelError(
          fmt::format("Wan {}: [T, H, W] = [{}, {}, {}] is not a multiple of the patch [{}, {}, {}]", what,
                      video.size(2), video.size(3), video.size(4), patch[0], patch[1], patch[2]));
  return {video.size(2) / patch[0], video.size(3) / patch[1], video.size(4) / patch[2]};
}

}  // namespace

WanGrid latent_grid(const at::Tensor& latents, const std::array<int64_t, 3>& patch) {
  return grid_of(latents, patch, "latents");
}

at::Tensor patchify(const at::Tensor& latents, const std::array<int64_t, 3>& patch, WanGrid* grid) {
  const WanGrid g = grid_of(latents, patch, "latents");
  if (grid) *grid = g;
  const int64_t batch = latents.size(0), channels = latents.size(1);
  return latents.reshape({batch, channels, g.frames, patch[0], g.rows, patch[1], g.columns, patch[2]})
      .permute({0, 2, 4, 6, 1, 3, 5, 7})  // [B, f, h, w, C, pt, ph, pw]
      .reshape({batch, g.tokens(), channels * patch[0] * patch[1] * patch[2]});
}

at::Tensor unpatchify(const at::Tensor& tokens, const WanGrid& grid, const std::array<int64_t, 3>& patch,
                      int64_t channels) {
  const int64_t volume = patch[0] * patch[1] * patch[2];
  if (tokens.dim() != 3 || tokens.size(1) != grid.tokens() || tokens.size(2) != volume * channels)
    throw ModelError(
        fmt::format("Wan unpatchify: tokens [{}] do not match a grid of {} x {} x {} with {} channels",
                    fmt::join(tokens.sizes(), ", "), grid.frames, grid.rows, grid.columns, channels));
  const int64_t batch = tokens.size(0);
  return tokens.reshape({batch, grid.frames, grid.rows, grid.columns, patch[0], patch[1], patch[2], channels})
      .permute({0, 7, 1, 4, 2, 5, 3, 6})  // [B, C, f, pt, h, ph, w, pw]
      .reshape({batch, channels, grid.frames * patch[0], grid.rows * patch[1], grid.columns * patch[2]});
}

at::Tensor head_tokens(const at::Tensor& video, const std::array<int64_t, 3>& patch) {
  const WanGrid g = grid_of(video, patch, "target");
  const int64_t batch = video.size(0), channels = video.size(1);
  return video.reshape({batch, channels, g.frames, patch[0], g.rows, patch[1], g.columns, patch[2]})
      .permute({0, 2, 4, 6, 3, 5, 7, 1})  // [B, f, h, w, pt, ph, pw, C]
      .reshape({batch, g.tokens(), patch[0] * patch[1] * patch[2] * channels});
}

}  // namespace loom::models
