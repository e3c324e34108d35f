// Qwen2-VL image preprocessing; the arithmetic follows the reference processor step by step
// (float64 rescale rounded to float32, then float32 normalisation) so results agree to rounding.
#include "loom/data/image/qwen2vl_processor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loom/data/image/resize.h"
#include "loom/util/errors.h"

namespace loom::data {

GridSize smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels, int64_t max_pixels) {
  if (height <= 0 || width <= 0) {
    throw DataError("smart_resize: image size " + std::to_string(height) + "x" + std::to_string(width) +
                    " must be positive");
  }
  if (factor <= 0 || min_pixels <= 0 || max_pixels < min_pixels) {
    throw ConfigError("smart_resize: factor " + std::to_string(factor) + ", min_pixels " +
                      std::to_string(min_pixels) + ", max_pixels " + std::to_string(max_pixels) +
                      " (need factor > 0 and 0 < min_pixels <= max_pixels)");
  }
  const double aspect =
      static_cast<double>(std::max(height, width)) / static_cast<double>(std::min(height, width));
  if (aspect > 200.0) {
    throw DataError("smart_resize: image " + std::to_string(height) + "x" + std::to_string(width) +
                    " has aspect ratio " + std::to_string(aspect) + ", at most 200 is allowed");
  }
  const double f = static_cast<double>(factor);
  const double h = static_cast<double>(height);
  const double w = static_cast<double>(width);
  // std::nearbyint in the default rounding mode rounds half to even, like Python's round().
  int64_t h_bar = std::max(factor, static_cast<int64_t>(std::nearbyint(h / f)) * factor);
  int64_t w_bar = std::max(factor, static_cast<int64_t>(std::nearbyint(w / f)) * factor);
  if (h_bar * w_bar > max_pixels) {
    const double beta = std::sqrt(h * w / static_cast<double>(max_pixels));
    h_bar = std::max(factor, static_cast<int64_t>(std::floor(h / beta / f)) * factor);
    w_bar = std::max(factor, static_cast<int64_t>(std::floor(w / beta / f)) * factor);
  } else if (h_bar * w_bar < min_pixels) {
    const double beta = std::sqrt(static_cast<double>(min_pixels) / (h * w));
    h_bar = static_cast<int64_t>(std::ceil(h * beta / f)) * factor;
    w_bar = static_cast<int64_t>(std::ceil(w * beta / f)) * factor;
  }
  return {h_bar, w_bar};
}

namespace {

// (H, W, 3) uint8 resized to `size` when it differs -> (3, H, W) float32:
// x = float(u * (1/255) in double), then (x - mean) / std.
at::Tensor normalized_planes(const Image& image, const GridSize& size, const Qwen2VLImageOptions& options) {
  if (image.height <= 0 || image.width <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.height) * image.width * 3) {
    throw DataError("qwen2vl image processor: image is " + std::to_string(image.height) + "x" +
                    std::to_string(image.width) + " with " + std::to_string(image.rgb.size()) +
                    " bytes (expected positive sides and height*width*3 bytes)");
  }
  Image resized_storage;
  const Image* source = &image;  // resized only when the size changes
  if (size.height != image.height || size.width != image.width) {
    resized_storage = resize_bicubic(image, static_cast<int>(size.height), static_cast<int>(size.width));
    source = &resized_storage;
  }
  const int64_t H = size.height, W = size.width, C = 3;
  constexpr double kRescale = 1.0 / 255.0;
  at::Tensor planes = at::empty({C, H, W}, at::kFloat);
  float* chw = planes.data_ptr<float>();
  for (int64_t y = 0; y < H; ++y) {
    for (int64_t x = 0; x < W; ++x) {
      const uint8_t* px = source->pixel(static_cast<int>(y), static_cast<int>(x));
      for (int64_t c = 0; c < C; ++c) {
        const float scaled = static_cast<float>(px[c] * kRescale);
        chw[(c * H + y) * W + x] = (scaled - options.mean[c]) / options.std[c];
      }
    }
  }
  return planes;
}

}  // namespace

VisionInput qwen2vl_process_frames(const std::vector<Image>& frames, double fps,
                                   const Qwen2VLImageOptions& options, bool video, const GridSize* given) {
  const int64_t p = options.patch_size;
  const int64_t m = options.merge_size;
  const int64_t T = options.temporal_patch_size;
  if (p <= 0 || m <= 0 || T <= 0) {
    throw ConfigError("qwen2vl image options: patch_size " + std::to_string(p) + ", merge_size " +
                      std::to_string(m) + ", temporal_patch_size " + std::to_string(T) +
                      " must all be positive");
  }
  if (frames.empty()) throw DataError("qwen2vl image processor: a video without frames");
  if (video && !(fps > 0 && std::isfinite(fps)))
    throw DataError(
        fmt::format("qwen2vl image processor: a video's frame rate must be positive, got {}", fps));
  const int64_t min_pixels =
      video && options.video_min_pixels > 0 ? options.video_min_pixels : options.min_pixels;
  const int64_t max_pixels =
      video && options.video_max_pixels > 0 ? options.video_max_pixels : options.max_pixels;
  const Image& first = frames.front();
  if (first.height <= 0 || first.width <= 0)
    throw DataError(fmt::format("qwen2vl image processor: a frame is {}x{}", first.height, first.width));
  // Every frame takes the size the first one gives.
  const GridSize size =
      given ? *given : smart_resize(first.height, first.width, p * m, min_pixels, max_pixels);
  if (size.height % (p * m) != 0 || size.width % (p * m) != 0 || size.height <= 0 || size.width <= 0)
    throw DataError(
        fmt::format("qwen2vl image processor: a {}x{} size is not cut into {}-pixel merged patches",
                    size.height, size.width, p * m));
  std::vector<at::Tensor> planes;
  for (const Image& frame : frames) planes.push_back(normalized_planes(frame, size, options));
  // The last frame is repeated to fill the last temporal patch (a still image fills one).
  while (planes.size() % static_cast<size_t>(T) != 0) planes.push_back(planes.back());
  const int64_t C = 3, H = size.height, W = size.width;
  const int64_t gt = static_cast<int64_t>(planes.size()) / T, gh = H / p, gw = W / p;
  // (gt, T, C, gh/m, m, p, gw/m, m, p) -> (gt, gh/m, gw/m, m, m, C, T, p, p) -> (gt*gh*gw, C*T*p*p)
  at::Tensor patches = at::stack(planes)
                           .reshape({gt, T, C, gh / m, m, p, gw / m, m, p})
                           .permute({0, 3, 6, 4, 7, 2, 1, 5, 8})
                           .clone(at::MemoryFormat::Contiguous)
                           .view({gt * gh * gw, C * T * p * p});
  VisionInput out{patches, {gt, gh, gw}, merged_token_count({gt, gh, gw}, m)};
  if (video) out.second_per_grid = static_cast<double>(T) / fps;
  return out;
}

VisionInput qwen2vl_process_image(const Image& image, const Qwen2VLImageOptions& options) {
  return qwen2vl_process_frames({image}, 0.0, options, /*video=*/false);
}

int64_t merged_token_count(const std::array<int64_t, 3>& grid, int64_t merge) {
  const int64_t unit = merge * merge;
  const int64_t patches = grid[0] * grid[1] * grid[2];
  if (merge <= 0 || patches % unit != 0) {
    throw DataError("merged_token_count: grid (" + std::to_string(grid[0]) + ", " + std::to_string(grid[1]) +
                    ", " + std::to_string(grid[2]) + ") does not divide into " + std::to_string(merge) + "x" +
                    std::to_string(merge) + " merge windows");
  }
  return patches / unit;
}

namespace {

// The pixel bounds settings give: min_pixels / max_pixels, else size's shortest_edge / longest_edge;
// those not given are left as they are.
void read_pixel_bounds(const nlohmann::json& j, int64_t& min_pixels, int64_t& max_pixels) {
  const bool sized = j.contains("size") && j["size"].is_object();
  if (j.contains("min_pixels"))
    min_pixels = j["min_pixels"].get<int64_t>();
  else if (sized && j["size"].contains("shortest_edge"))
    min_pixels = j["size"]["shortest_edge"].get<int64_t>();
  if (j.contains("max_pixels"))
    max_pixels = j["max_pixels"].get<int64_t>();
  else if (sized && j["size"].contains("longest_edge"))
    max_pixels = j["size"]["longest_edge"].get<int64_t>();
}

// The video processor's settings in a model directory, as transformers looks for them; null when
// there are none of its own.
ImageProcessorSettings read_video_processor_settings(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"processor_config.json", "video_preprocessor_config.json"}) {
    const fs::path path = fs::path(dir) / name;
    if (!fs::is_regular_file(path)) continue;
    std::ifstream in(path);
    nlohmann::json file;
    try {
      file = nlohmann::json::parse(in);
    } catch (const nlohmann::json::parse_error& e) {
      throw DataError(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
    }
    if (std::string(name) == "video_preprocessor_config.json") return {std::move(file), path.string()};
    if (file.is_object() && file.contains("video_processor"))
      return {std::move(file["video_processor"]), path.string()};
  }
  return {};
}

}  // namespace

Qwen2VLImageOptions read_qwen2vl_image_options(const std::string& dir, Qwen2VLImageOptions options) {
  const ImageProcessorSettings video = read_video_processor_settings(dir);
  if (!video.settings.is_null()) {
    try {
      read_pixel_bounds(video.settings, options.video_min_pixels, options.video_max_pixels);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: {}", video.path, e.what()));
    }
  }
  const ImageProcessorSettings read = read_image_processor_settings(dir);
  if (read.settings.is_null()) return options;
  const std::string& path = read.path;
  try {
    const nlohmann::json& j = read.settings;
    read_pixel_bounds(j, options.min_pixels, options.max_pixels);
    if (j.contains("image_mean"))
      for (size_t c = 0; c < 3; ++c) options.mean[c] = j["image_mean"].at(c).get<float>();
    if (j.contains("image_std"))
      for (size_t c = 0; c < 3; ++c) options.std[c] = j["image_std"].at(c).get<float>();
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: {}", path, e.what()));
  }
  return options;
}

const ImageBlock& Qwen2VLImageProcessor::block() const {
  static const ImageBlock block{"<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "", "<|video_pad|>"};
  return block;
}

void Qwen2VLImageProcessor::set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels) {
  if (min_pixels > 0) options_.video_min_pixels = min_pixels;
  if (max_pixels > 0) options_.video_max_pixels = max_pixels;
  const int64_t min = options_.video_min_pixels > 0 ? options_.video_min_pixels : options_.min_pixels;
  const int64_t max = options_.video_max_pixels > 0 ? options_.video_max_pixels : options_.max_pixels;
  if (max < min)
    throw ConfigError(fmt::format(
        "data.video_max_pixels: a video frame's bound {} is less than its min_pixels {}", max, min));
}

void Qwen2VLImageProcessor::set_pixel_bounds(int64_t min_pixels, int64_t max_pixels) {
  if (min_pixels > 0) options_.min_pixels = min_pixels;
  if (max_pixels > 0) options_.max_pixels = max_pixels;
  if (options_.max_pixels < options_.min_pixels)
    throw ConfigError(fmt::format("data.max_pixels: {} is less than the image processor's min_pixels {}",
                                  options_.max_pixels, options_.min_pixels));
}

void Qwen2VLImageProcessor::set_square_images(int64_t side) {
  // The side the resize gives (a multiple of patch x merge, the nearest, as smart_resize rounds), fixed.
  const int64_t multiple = size_multiple();
  if (side < 1) throw ConfigError(fmt::format("data.image_size: {} is not a positive side", side));
  const auto nearest =
      static_cast<int64_t>(std::nearbyint(static_cast<double>(side) / static_cast<double>(multiple)));
  const int64_t resized = std::max<int64_t>(1, nearest) * multiple;
  options_.min_pixels = options_.max_pixels = resized * resized;
}

nlohmann::ordered_json Qwen2VLImageProcessor::preprocessor_config() const {
  const Qwen2VLImageOptions& image = options_;
  return {{"image_processor_type", "Qwen2VLImageProcessor"},
          {"processor_class", "Qwen2VLProcessor"},
          {"do_convert_rgb", true},
          {"do_resize", true},
          {"resample", 3},  // bicubic
          {"do_rescale", true},
          {"rescale_factor", 1.0 / 255.0},
          {"do_normalize", true},
          {"image_mean", image.mean},
          {"image_std", image.std},
          {"min_pixels", image.min_pixels},
          {"max_pixels", image.max_pixels},
          {"size",
           {{"min_pixels", image.min_pixels},
            {"max_pixels", image.max_pixels},
            {"shortest_edge", image.min_pixels},
            {"longest_edge", image.max_pixels}}},
          {"patch_size", image.patch_size},
          {"temporal_patch_size", image.temporal_patch_size},
          {"merge_size", image.merge_size}};
}

nlohmann::ordered_json Qwen2VLImageProcessor::video_preprocessor_config() const {
  // The image processor's settings, with a frame's bounds for the image's.
  const Qwen2VLImageOptions& o = options_;
  const int64_t min_pixels = o.video_min_pixels > 0 ? o.video_min_pixels : o.min_pixels;
  const int64_t max_pixels = o.video_max_pixels > 0 ? o.video_max_pixels : o.max_pixels;
  const nlohmann::ordered_json image = preprocessor_config();
  nlohmann::ordered_json video;
  for (const auto& [key, value] : image.items()) {
    if (key == "image_processor_type")
      video["video_processor_type"] = "Qwen2VLVideoProcessor";
    else if (key == "min_pixels" || key == "max_pixels")
      video[key] = key == "min_pixels" ? min_pixels : max_pixels;
    else if (key == "size")
      video[key] = {{"shortest_edge", min_pixels}, {"longest_edge", max_pixels}};
    else
      video[key] = value;
  }
  video["do_sample_frames"] = false;
  video["cap_pixels_per_frame"] = false;
  return video;
}

const std::string& Qwen2VLImageProcessor::default_system() const {
  static const std::string system = "You are a helpful assistant.";
  return system;
}

}  // namespace loom::data
