// InternVL image tiling; the grid choice, the resizes and the arithmetic follow the reference
// processor step by step (float64 rescale rounded to float32, then float32 normalisation) so results
// agree to rounding.
#include "loom/models/internvl/processor.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <array>
#include <charconv>
#include <cmath>
#include <limits>
#include <string>

#include "loom/data/image/resize.h"
#include "loom/util/errors.h"

namespace loom::models {
namespace {

// Largest canvas side accepted, far above the 448 x 12 of real checkpoints; keeps sizes within int.
constexpr int64_t kMaxCanvasSide = 1 << 16;

void check_options(const InternVLImageOptions& o) {
  if (o.tile_size <= 0 || o.patch_size <= 0 || o.tile_size % o.patch_size != 0 || o.min_tiles < 1 ||
      o.max_tiles < o.min_tiles || o.tokens_per_tile <= 0 || o.tile_size * o.max_tiles > kMaxCanvasSide)
    throw ConfigError(fmt::format(
        "internvl image options: tile_size {}, patch_size {}, min_tiles {}, max_tiles {}, tokens_per_tile {} "
        "(need tile_size a positive multiple of patch_size, 1 <= min_tiles <= max_tiles, "
        "tile_size * max_tiles <= {}, tokens_per_tile > 0)",
        o.tile_size, o.patch_size, o.min_tiles, o.max_tiles, o.tokens_per_tile, kMaxCanvasSide));
}

// Writes the tile x tile window of `image` whose top-left pixel is (top, left) to `out` as (3, tile,
// tile): x = float(u * (1/255) in double), then (x - mean) / std in float.
void normalise_tile(const data::Image& image, int64_t top, int64_t left, const InternVLImageOptions& options,
                    float* out) {
  const int64_t tile = options.tile_size;
  constexpr double kRescale = 1.0 / 255.0;
  for (int64_t y = 0; y < tile; ++y) {
    for (int64_t x = 0; x < tile; ++x) {
      const uint8_t* px = image.pixel(static_cast<int>(top + y), static_cast<int>(left + x));
      for (int64_t c = 0; c < 3; ++c) {
        const float scaled = static_cast<float>(px[c] * kRescale);
        out[(c * tile + y) * tile + x] = (scaled - options.mean[c]) / options.std[c];
      }
    }
  }
}

// Float settings as the decimals they were written as (0.485f -> 0.485, not 0.48500001430511475), so
// the saved config reads like the published one. fmt and from_chars ignore the locale.
std::array<double, 3> as_written(const std::array<float, 3>& values) {
  std::array<double, 3> decimals{};
  for (size_t c = 0; c < 3; ++c) {
    const std::string text = fmt::format("{}", values[c]);  // the shortest decimal that reads back as it
    std::from_chars(text.data(), text.data() + text.size(), decimals[c]);
  }
  return decimals;
}

}  // namespace

TileGrid internvl_tile_grid(int64_t height, int64_t width, const InternVLImageOptions& options) {
  check_options(options);
  if (height <= 0 || width <= 0)
    throw DataError(
        fmt::format("internvl_tile_grid: image size {}x{} (height x width) must be positive", height, width));
  const double aspect = static_cast<double>(width) / static_cast<double>(height);
  const double area = static_cast<double>(width) * static_cast<double>(height);
  const double tile_area = static_cast<double>(options.tile_size) * static_cast<double>(options.tile_size);
  // Grids are visited by tile count, and within one count by columns: the reference's order (its list
  // is built columns-outer, then stably sorted by count), which decides who wins a tie.
  TileGrid best{1, 1};
  double best_diff = std::numeric_limits<double>::infinity();
  for (int64_t tiles = options.min_tiles; tiles <= options.max_tiles; ++tiles) {
    for (int64_t columns = 1; columns <= tiles; ++columns) {
      if (tiles % columns != 0) continue;
      const int64_t rows = tiles / columns;
      const double diff = std::fabs(aspect - static_cast<double>(columns) / static_cast<double>(rows));
      if (diff < best_diff) {
        best_diff = diff;
        best = {columns, rows};
      } else if (diff == best_diff && area > 0.5 * tile_area * static_cast<double>(tiles)) {
        // An equal fit: more tiles, while they would not cover more than twice the image's area.
        best = {columns, rows};
      }
    }
  }
  return best;
}

data::VisionInput internvl_process_image(const data::Image& image, const InternVLImageOptions& options) {
  check_options(options);
  if (image.height <= 0 || image.width <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.height) * image.width * 3)
    throw DataError(fmt::format(
        "internvl_process_image: image is {}x{} (height x width) with {} bytes (expected positive sides "
        "and height*width*3 bytes)",
        image.height, image.width, image.rgb.size()));
  const TileGrid grid = internvl_tile_grid(image.height, image.width, options);
  const int64_t tile = options.tile_size;
  const int64_t tiles = grid.columns * grid.rows;
  const bool thumbnail = tiles > 1;
  const int64_t patches = tiles + (thumbnail ? 1 : 0);

  // pixel_values (patches, 3, tile, tile): tile i is the canvas's (row i / columns, column i % columns).
  at::Tensor pixel_values = at::empty({patches, 3, tile, tile}, at::kFloat);
  float* out = pixel_values.data_ptr<float>();
  const int64_t tile_values = 3 * tile * tile;
  const data::Image canvas =
      data::resize_bicubic(image, static_cast<int>(tile * grid.rows), static_cast<int>(tile * grid.columns));
  for (int64_t i = 0; i < tiles; ++i)
    normalise_tile(canvas, (i / grid.columns) * tile, (i % grid.columns) * tile, options,
                   out + i * tile_values);
  if (thumbnail) {
    // The original image, not the canvas, resized to one tile.
    const data::Image small = data::resize_bicubic(image, static_cast<int>(tile), static_cast<int>(tile));
    normalise_tile(small, 0, 0, options, out + tiles * tile_values);
  }
  const int64_t side = tile / options.patch_size;
  return {pixel_values, {patches, side, side}, patches * options.tokens_per_tile};
}

InternVLImageProcessor::InternVLImageProcessor(const InternVLImageOptions& options) : options_(options) {
  check_options(options_);
}

const data::ImageBlock& InternVLImageProcessor::block() const {
  static const data::ImageBlock block{"<img>", "<IMG_CONTEXT>", "</img>", "<IMG_CONTEXT>"};
  return block;
}

void InternVLImageProcessor::set_pixel_bounds(int64_t min_pixels, int64_t max_pixels) {
  throw ConfigError(fmt::format(
      "data.min_pixels / data.max_pixels ({}, {}): InternVL does not bound an image's pixels; it resizes "
      "every image onto a grid of {} to {} tiles of {}x{} pixels",
      min_pixels, max_pixels, options_.min_tiles, options_.max_tiles, options_.tile_size,
      options_.tile_size));
}

void InternVLImageProcessor::set_square_images(int64_t side) {
  if (side < 1) throw ConfigError(fmt::format("data.image_size: {} is not a positive side", side));
  // A square is one tile, resized to the tile size: never cut, no thumbnail.
  options_.min_tiles = options_.max_tiles = 1;
}

nlohmann::ordered_json InternVLImageProcessor::preprocessor_config() const {
  return {{"crop_to_patches", true},
          {"do_convert_rgb", true},
          {"do_normalize", true},
          {"do_rescale", true},
          {"do_resize", true},
          {"image_mean", as_written(options_.mean)},
          {"image_processor_type", "GotOcr2ImageProcessor"},
          {"image_std", as_written(options_.std)},
          {"max_patches", options_.max_tiles},
          {"min_patches", options_.min_tiles},
          {"resample", 3},  // bicubic
          {"rescale_factor", 1.0 / 255.0},
          {"size", {{"height", options_.tile_size}, {"width", options_.tile_size}}}};
}

nlohmann::ordered_json InternVLImageProcessor::processor_config() const {
  return {{"image_seq_length", options_.tokens_per_tile}, {"processor_class", "InternVLProcessor"}};
}

nlohmann::ordered_json InternVLImageProcessor::named_tokens() const {
  const data::ImageBlock& b = block();
  // transformers' InternVLProcessor also reads a video token, which Loom's InternVL does not train.
  return {{"context_image_token", b.pad},
          {"end_image_token", b.end},
          {"start_image_token", b.start},
          {"video_token", "<video>"}};
}

const std::string& InternVLImageProcessor::default_system() const {
  static const std::string system;
  return system;
}

}  // namespace loom::models
