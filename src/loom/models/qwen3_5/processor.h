// Qwen3.5's image processor: transformers' Qwen2VLImageProcessor with Qwen3.5's settings (patches
// of 16, merged 2 x 2, mean and std 0.5, 65,536 to 16,777,216 pixels) unless the model directory's
// preprocessor_config.json says otherwise; no default system message (Qwen3.5's chat template writes
// none). Videos (each temporal patch a block of its own after a timestamp) are not supported yet.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "loom/data/image/qwen2vl_processor.h"
#include "loom/models/qwen3_5/vision.h"

namespace loom::models::qwen3_5 {

// The processor settings of a model of `vision`, with those of `dir`'s processor files when given.
data::Qwen2VLImageOptions image_options(const VisionConfig& vision, const std::string& dir);

class ImageProcessor : public data::Qwen2VLImageProcessor {
 public:
  using data::Qwen2VLImageProcessor::Qwen2VLImageProcessor;
  bool takes_videos() const override { return false; }
  data::VisionInput process_video(const std::vector<data::Image>& frames, double fps) const override;
  void set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels) override;
  nlohmann::ordered_json preprocessor_config() const override;
  nlohmann::ordered_json video_preprocessor_config() const override { return nullptr; }
  const std::string& default_system() const override;
};

}  // namespace loom::models::qwen3_5
