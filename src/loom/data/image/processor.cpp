#include "loom/data/image/processor.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "loom/util/errors.h"

namespace loom::data {

ImageProcessorSettings read_image_processor_settings(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path path = fs::path(dir) / "preprocessor_config.json";
  std::string within;
  if (!fs::exists(path)) {
    path = fs::path(dir) / "processor_config.json";
    within = "image_processor";
  }
  if (!fs::exists(path)) return {};
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot be read", path.string()));
  nlohmann::json file;
  try {
    file = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
  if (within.empty()) return {std::move(file), path.string()};
  if (!file.is_object() || !file.contains(within) || !file[within].is_object())
    throw DataError(fmt::format("{}: no \"{}\" object", path.string(), within));
  return {file[within], path.string()};
}

VisionInput ImageProcessor::process_video(const std::vector<Image>&, double) const {
  throw DataError("this model's processor takes images, not videos");
}

void ImageProcessor::set_video_pixel_bounds(int64_t, int64_t) {
  throw ConfigError(
      "data.video_min_pixels, data.video_max_pixels: this model's processor takes images, not videos");
}

}  // namespace loom::data
