#include "loom/models/qwen3_5/processor.h"

#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {

data::Qwen2VLImageOptions image_options(const VisionConfig& vision, const std::string& dir) {
  data::Qwen2VLImageOptions options;
  options.patch_size = vision.patch_size;
  options.temporal_patch_size = vision.temporal_patch_size;
  options.merge_size = vision.spatial_merge_size;
  options.min_pixels = 65536;
  options.max_pixels = 16777216;
  options.mean = {0.5f, 0.5f, 0.5f};
  options.std = {0.5f, 0.5f, 0.5f};
  return dir.empty() ? options : data::read_qwen2vl_image_options(dir, options);
}

namespace {
constexpr const char* kNoVideos =
    "Qwen3.5's videos (each temporal patch a block of its own after a timestamp) are not supported in this "
    "version of Loom";
}

data::VisionInput ImageProcessor::process_video(const std::vector<data::Image>&, double) const {
  throw DataError(kNoVideos);
}

void ImageProcessor::set_video_pixel_bounds(int64_t, int64_t) {
  throw ConfigError(std::string("data.video_min_pixels, data.video_max_pixels: ") + kNoVideos);
}

nlohmann::ordered_json ImageProcessor::preprocessor_config() const {
  nlohmann::ordered_json config = data::Qwen2VLImageProcessor::preprocessor_config();
  config["processor_class"] = "Qwen3VLProcessor";
  return config;
}

const std::string& ImageProcessor::default_system() const {
  static const std::string none;
  return none;
}

}  // namespace loom::models::qwen3_5
