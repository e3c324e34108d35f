// Qwen2-VL image preprocessing: resize to a patch-aligned size, normalise, and flatten into the
// rows of patches the vision tower embeds, matching the reference image processor.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "loom/data/image/image.h"

namespace loom::data {

struct GridSize {
  int64_t height;
  int64_t width;
};

// The size an image is resized to: each side rounded (half to even) to a multiple of factor, then
// scaled down (floor) to fit max_pixels or up (ceil) to reach min_pixels, keeping the aspect ratio;
// each side is at least factor. Throws DataError when a side is not positive or the aspect
// ratio exceeds 200.
GridSize smart_resize(int64_t height, int64_t width, int64_t factor = 28, int64_t min_pixels = 56 * 56,
                      int64_t max_pixels = 28 * 28 * 1280);

struct VisionInput {
  at::Tensor pixel_values;          // (gt*gh*gw, C*temporal*patch*patch) float32, e.g. (24, 1176)
  std::array<int64_t, 3> grid_thw;  // (gt, gh, gw) in patches before merging
};

struct Qwen2VLImageOptions {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  std::array<float, 3> mean{0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std{0.26862954f, 0.26130258f, 0.27577711f};
};

// One image -> patch rows. Each row is laid out [C][T][patch][patch]; rows come in groups of
// merge_size^2 (one merge window), windows in row-major order.
VisionInput qwen2vl_process_image(const Image& image, const Qwen2VLImageOptions& options = {});

// Number of LLM tokens an image occupies after the merger: gt*gh*gw / merge^2.
int64_t merged_token_count(const std::array<int64_t, 3>& grid, int64_t merge = 2);

}  // namespace loom::data
