#include "loom/models/qwen3_5/processor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

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

// Qwen3VLVideoProcessor's bounds on a clip's pixels (every frame's together) when the model gives none.
constexpr int64_t kVideoMinPixels = 128 * 32 * 32, kVideoMaxPixels = 32 * 32 * 768;

int64_t video_min(const data::Qwen2VLImageOptions& o) {
  return o.video_min_pixels > 0 ? o.video_min_pixels : kVideoMinPixels;
}
int64_t video_max(const data::Qwen2VLImageOptions& o) {
  return o.video_max_pixels > 0 ? o.video_max_pixels : kVideoMaxPixels;
}

}  // namespace

data::GridSize video_size(int64_t frames, int64_t height, int64_t width, int64_t temporal, int64_t factor,
                          int64_t min_pixels, int64_t max_pixels) {
  if (frames < temporal)
    throw DataError(
        fmt::format("a video of {} frames is shorter than a temporal patch of {}", frames, temporal));
  if (height <= 0 || width <= 0) throw DataError(fmt::format("a video frame is {}x{}", height, width));
  double h = static_cast<double>(height), w = static_cast<double>(width);
  const double f = static_cast<double>(factor);
  if (height < factor || width < factor) {  // scaled up to the factor, truncated as int() does
    const double scale = std::max(f / h, f / w);
    h = std::trunc(h * scale);
    w = std::trunc(w * scale);
  }
  if (std::max(h, w) / std::min(h, w) > 200)
    throw DataError(fmt::format("a video frame of {}x{} has an aspect ratio above 200", height, width));
  // std::nearbyint rounds half to even, as Python's round().
  int64_t h_bar = static_cast<int64_t>(std::nearbyint(h / f)) * factor;
  int64_t w_bar = static_cast<int64_t>(std::nearbyint(w / f)) * factor;
  const int64_t t_bar =
      static_cast<int64_t>(std::nearbyint(static_cast<double>(frames) / temporal)) * temporal;
  const double t = static_cast<double>(frames);
  if (t_bar * h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(t * h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (t_bar * h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (t * h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

std::vector<double> video_timestamps(int64_t frames, double fps, int64_t temporal) {
  std::vector<double> seconds;
  for (int64_t i = 0; i < frames; ++i) seconds.push_back(static_cast<double>(i) / fps);
  while (seconds.size() % static_cast<size_t>(temporal) != 0) seconds.push_back(seconds.back());
  std::vector<double> out;
  for (size_t i = 0; i < seconds.size(); i += static_cast<size_t>(temporal))
    out.push_back((seconds[i] + seconds[i + temporal - 1]) / 2);
  return out;
}

data::VisionInput ImageProcessor::process_video(const std::vector<data::Image>& frames, double fps) const {
  const data::Qwen2VLImageOptions& o = options();
  if (frames.empty()) throw DataError("Qwen3.5 video processor: a video without frames");
  if (!(fps > 0 && std::isfinite(fps)))
    throw DataError(
        fmt::format("Qwen3.5 video processor: a video's frame rate must be positive, got {}", fps));
  // A clip shorter than a temporal patch counts as one (transformers refuses it; Loom repeats its
  // last frame, as it does to fill any last patch).
  const int64_t counted = std::max<int64_t>(static_cast<int64_t>(frames.size()), o.temporal_patch_size);
  const data::GridSize size =
      video_size(counted, frames.front().height, frames.front().width, o.temporal_patch_size,
                 o.patch_size * o.merge_size, video_min(o), video_max(o));
  // Each frame resized as transformers' video processor resizes it (torchvision: ATen's antialiased
  // bicubic on the 8-bit frame), then processed at that size.
  std::vector<data::Image> resized;
  for (const data::Image& frame : frames) {
    if (frame.height == size.height && frame.width == size.width) {
      resized.push_back(frame);
      continue;
    }
    if (frame.height <= 0 || frame.width <= 0 ||
        frame.rgb.size() != static_cast<size_t>(frame.height) * static_cast<size_t>(frame.width) * 3)
      throw DataError(fmt::format("Qwen3.5 video processor: a {}x{} frame with {} bytes", frame.height,
                                  frame.width, frame.rgb.size()));
    const at::Tensor planes =
        at::from_blob(const_cast<uint8_t*>(frame.rgb.data()), {1, frame.height, frame.width, 3}, at::kByte)
            .permute({0, 3, 1, 2});
    const at::Tensor scaled =
        at::_upsample_bicubic2d_aa(planes, {size.height, size.width}, /*align_corners=*/false)
            .permute({0, 2, 3, 1})
            .contiguous();
    data::Image image{static_cast<int>(size.height), static_cast<int>(size.width), {}};
    image.rgb.assign(scaled.data_ptr<uint8_t>(), scaled.data_ptr<uint8_t>() + scaled.numel());
    resized.push_back(std::move(image));
  }
  data::VisionInput out = data::qwen2vl_process_frames(resized, fps, o, /*video=*/true, &size);
  out.timestamps = video_timestamps(static_cast<int64_t>(frames.size()), fps, o.temporal_patch_size);
  return out;
}

void ImageProcessor::set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels) {
  data::Qwen2VLImageOptions o = options();
  if (min_pixels > 0) o.video_min_pixels = min_pixels;
  if (max_pixels > 0) o.video_max_pixels = max_pixels;
  if (video_max(o) < video_min(o))
    throw ConfigError(fmt::format("data.video_max_pixels: a clip's bound {} is less than its min_pixels {}",
                                  video_max(o), video_min(o)));
  data::Qwen2VLImageProcessor::set_video_pixel_bounds(min_pixels, max_pixels);
}

const data::ImageBlock& ImageProcessor::block() const {
  static const data::ImageBlock block{"<|vision_start|>",       "<|image_pad|>", "<|vision_end|>", "",
                                      "<|video_pad|>",
                                      /*video_timestamps=*/true};
  return block;
}

nlohmann::ordered_json ImageProcessor::video_preprocessor_config() const {
  // Qwen3VLVideoProcessor's, with the clip's bounds; frames taken as given (Loom samples them).
  const data::Qwen2VLImageOptions& o = options();
  nlohmann::ordered_json video = data::Qwen2VLImageProcessor::video_preprocessor_config();
  video["video_processor_type"] = "Qwen3VLVideoProcessor";
  video.erase("min_pixels");
  video.erase("max_pixels");
  video["size"] = {{"shortest_edge", video_min(o)}, {"longest_edge", video_max(o)}};
  return video;
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
