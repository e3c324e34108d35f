#include "loom/nn/rope.h"

#include "loom/kernels/pointwise.h"
#include "loom/nn/fused.h"
#include "loom/util/errors.h"

namespace loom::nn {

at::Tensor rope_inverse_frequencies(int64_t dim, double theta) {
  auto exponents = at::arange(0, dim, 2, at::kFloat) / static_cast<double>(dim);
  return 1.0 / at::pow(theta, exponents);
}

at::Tensor vision_patch_positions(const at::Tensor& grid_thw, int64_t merge_size) {
  auto grid = grid_thw.to(at::kLong).contiguous();
  auto g = grid.accessor<int64_t, 2>();
  std::vector<int64_t> rows_cols;
  for (int64_t i = 0; i < grid.size(0); ++i) {
    const int64_t t = g[i][0], h = g[i][1], w = g[i][2];
    if (h % merge_size || w % merge_size)
      throw ModelError(fmt::format("image {} grid ({}, {}, {}) is not divisible by the merge size {}", i, t,
                                   h, w, merge_size));
    for (int64_t frame = 0; frame < t; ++frame)
      for (int64_t bh = 0; bh < h / merge_size; ++bh)
        for (int64_t bw = 0; bw < w / merge_size; ++bw)
          for (int64_t ih = 0; ih < merge_size; ++ih)
            for (int64_t iw = 0; iw < merge_size; ++iw) {
              rows_cols.push_back(bh * merge_size + ih);
              rows_cols.push_back(bw * merge_size + iw);
            }
  }
  const int64_t n = static_cast<int64_t>(rows_cols.size()) / 2;
  return at::tensor(rows_cols, at::kLong).view({n, 2});
}

at::Tensor vision_rope_angles(const at::Tensor& positions, int64_t head_dim, double theta) {
  auto inv_freq = rope_inverse_frequencies(head_dim / 2, theta);    // (head_dim/4)
  auto angles = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;  // (N, 2, head_dim/4)
  auto half = angles.flatten(1);                                    // (N, head_dim/2): rows then cols
  return at::cat({half, half}, -1);                                 // (N, head_dim)
}

at::Tensor mrope_angles(const at::Tensor& position_ids, int64_t head_dim, double theta,
                        const std::vector<int64_t>& sections) {
  int64_t total = 0;
  for (auto s : sections) total += s;
  if (total * 2 != head_dim)
    throw ModelError(fmt::format("rope_scaling.mrope_section sums to {}, but it must equal head_dim/2 = {}",
                                 total, head_dim / 2));
  auto inv_freq = rope_inverse_frequencies(head_dim, theta);           // (head_dim/2)
  auto angles = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq;  // (3, B, L, head_dim/2)
  // Dims [0, s0) from axis 0, [s0, s0+s1) from axis 1, the rest from axis 2.
  std::vector<at::Tensor> parts;
  int64_t start = 0;
  for (size_t axis = 0; axis < sections.size(); ++axis) {
    parts.push_back(angles[axis].narrow(-1, start, sections[axis]));
    start += sections[axis];
  }
  auto half = at::cat(parts, -1);    // (B, L, head_dim/2)
  return at::cat({half, half}, -1);  // (B, L, head_dim)
}

at::Tensor apply_rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return fused_kernels() ? kernels::rotary(x, cos, sin) : kernels::rotary_composite(x, cos, sin);
}

}  // namespace loom::nn
