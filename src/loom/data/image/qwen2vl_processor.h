// Qwen2-VL image preprocessing: resize to a patch-aligned size, normalise, and flatten into the
// rows of patches the vision tower embeds, matching the reference image processor.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/image/image.h"
#include "loom/data/image/processor.h"

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

struct Qwen2VLImageOptions {
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  int64_t video_min_pixels = 0, video_max_pixels = 0;  // a video frame's bounds; 0: the image's
  int64_t patch_size = 14;
  int64_t temporal_patch_size = 2;
  int64_t merge_size = 2;
  std::array<float, 3> mean{0.48145466f, 0.4578275f, 0.40821073f};
  std::array<float, 3> std{0.26862954f, 0.26130258f, 0.27577711f};
};

// One image -> patch rows (gt*gh*gw, C*temporal*patch*patch) float32, e.g. (24, 1176), with their
// grid (gt, gh, gw) in patches before merging and the merged tokens they take. Each row is laid out
// [C][T][patch][patch]; rows come in groups of merge_size^2 (one merge window), windows in row-major
// order.
VisionInput qwen2vl_process_image(const Image& image, const Qwen2VLImageOptions& options = {});

// The frames of one video (or, with video false, the one frame of an image) as transformers'
// Qwen2VLImageProcessor makes them: every frame resized to the size smart_resize gives the first
// (within the video bounds when set), normalised, the last frame repeated until the count is a
// multiple of temporal_patch_size, each temporal patch's rows in the image layout, patches in time
// order: grid (frames / T, gh, gw). A video's second_per_grid is temporal_patch_size / fps.
// DataError for no frames, a frame of no pixels, or a video fps that is not positive.
// `size`, when given, is the frames' size instead of the one smart_resize gives.
VisionInput qwen2vl_process_frames(const std::vector<Image>& frames, double fps,
                                   const Qwen2VLImageOptions& options, bool video,
                                   const GridSize* size = nullptr);

// Number of LLM tokens an image occupies after the merger: gt*gh*gw / merge^2.
int64_t merged_token_count(const std::array<int64_t, 3>& grid, int64_t merge = 2);

// `options` with the image processor settings of a model directory: its preprocessor_config.json, or
// transformers 5's processor_config.json (the settings under "image_processor", the pixel bounds as
// size.shortest_edge / longest_edge); `options` as they are when neither exists. A video frame's
// bounds come, as transformers' video processor takes them, from processor_config.json's
// "video_processor", else video_preprocessor_config.json; without either, a frame has the image's. DataError
// naming the file when it is not valid JSON or a value has the wrong type.
Qwen2VLImageOptions read_qwen2vl_image_options(const std::string& dir, Qwen2VLImageOptions options);

// Qwen2VLImageProcessor as the data path uses it: images as <|vision_start|>, the merged tokens'
// <|image_pad|>, <|vision_end|>; "You are a helpful assistant." as the default system message.
class Qwen2VLImageProcessor : public ImageProcessor {
 public:
  explicit Qwen2VLImageProcessor(const Qwen2VLImageOptions& options) : options_(options) {}
  VisionInput process(const Image& image) const override { return qwen2vl_process_image(image, options_); }
  bool takes_videos() const override { return true; }
  VisionInput process_video(const std::vector<Image>& frames, double fps) const override {
    return qwen2vl_process_frames(frames, fps, options_, /*video=*/true);
  }
  const ImageBlock& block() const override;
  void set_pixel_bounds(int64_t min_pixels, int64_t max_pixels) override;
  void set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels) override;
  // Resized to the nearest multiple of patch x merge (56 -> 56 at Qwen2-VL's 28, 64 at Qwen3.5's 32):
  // min_pixels = max_pixels = that side squared.
  void set_square_images(int64_t side) override;
  int64_t size_multiple() const override { return options_.patch_size * options_.merge_size; }
  // Its settings, with both the older (min_pixels, max_pixels) and the newer (shortest_edge,
  // longest_edge) forms of its size.
  nlohmann::ordered_json preprocessor_config() const override;
  // Qwen2VLVideoProcessor's: a frame's bounds as size (and min_pixels, max_pixels), frames taken as
  // given (do_sample_frames false: Loom samples them) and no cap on a video's total pixels.
  nlohmann::ordered_json video_preprocessor_config() const override;
  // None: Qwen2VLProcessor is found from config.json's model_type and takes its tokens' defaults.
  nlohmann::ordered_json processor_config() const override { return nullptr; }
  nlohmann::ordered_json named_tokens() const override { return nlohmann::ordered_json::object(); }
  const std::string& default_system() const override;
  const Qwen2VLImageOptions& options() const { return options_; }

 private:
  Qwen2VLImageOptions options_;
};

}  // namespace loom::data
