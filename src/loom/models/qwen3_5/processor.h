// Qwen3.5's image processor: transformers' Qwen2VLImageProcessor with Qwen3.5's settings (patches
// of 16, merged 2 x 2, mean and std 0.5, 65,536 to 16,777,216 pixels) unless the model directory's
// preprocessor_config.json says otherwise; no default system message (Qwen3.5's chat template writes
// none). Videos as transformers' Qwen3VLVideoProcessor and Qwen3VLProcessor make them: the frames as
// given (Loom samples them), resized to one size for the whole clip from bounds on its pixels over
// every frame (the model directory's video processor settings, else 131,072 to 786,432), the last
// frame repeated to fill the last temporal patch; in the text, each temporal patch is a block of its
// own after its time, "<t.t seconds>", the mean of its frames' (frame i at i / fps).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/image/qwen2vl_processor.h"
#include "loom/models/qwen3_5/vision.h"

namespace loom::models::qwen3_5 {

// The processor settings of a model of `vision`, with those of `dir`'s processor files when given.
data::Qwen2VLImageOptions image_options(const VisionConfig& vision, const std::string& dir);

// Qwen3VLVideoProcessor's smart_resize: a clip's one frame size (multiples of `factor`) from bounds on
// its pixels over every frame (t_bar x h x w, t_bar the frames rounded to whole temporal patches).
// DataError for fewer frames than a temporal patch, a frame of no pixels, or an aspect above 200.
data::GridSize video_size(int64_t frames, int64_t height, int64_t width, int64_t temporal, int64_t factor,
                          int64_t min_pixels, int64_t max_pixels);

// Each temporal patch's time in seconds, as Qwen3VLProcessor computes it: frame i at i / fps, the
// last repeated to fill the last patch, each patch the mean of its first and last frames'.
std::vector<double> video_timestamps(int64_t frames, double fps, int64_t temporal);

class ImageProcessor : public data::Qwen2VLImageProcessor {
 public:
  using data::Qwen2VLImageProcessor::Qwen2VLImageProcessor;
  bool takes_videos() const override { return true; }
  data::VisionInput process_video(const std::vector<data::Image>& frames, double fps) const override;
  // The clip's bounds: every frame's pixels together (data.video_min_pixels, data.video_max_pixels).
  void set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels) override;
  const data::ImageBlock& block() const override;
  nlohmann::ordered_json preprocessor_config() const override;
  nlohmann::ordered_json video_preprocessor_config() const override;
  const std::string& default_system() const override;
};

}  // namespace loom::models::qwen3_5
