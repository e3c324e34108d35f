// InternVL's image processor (transformers' GotOcr2ImageProcessorPil with crop_to_patches, as
// InternVLProcessor calls it): an image cut into tile x tile tiles on the grid whose shape is closest
// to its own, plus a thumbnail of the whole image when there is more than one tile.
#pragma once
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "loom/data/image/image.h"
#include "loom/data/image/processor.h"

namespace loom::models {

struct InternVLImageOptions {
  int64_t tile_size = 448;        // the vision tower's image_size
  int64_t patch_size = 14;        // the vision tower's patch size (grid_thw counts patches per side)
  int64_t min_tiles = 1;          // GotOcr2's min_patches
  int64_t max_tiles = 12;         // GotOcr2's max_patches
  int64_t tokens_per_tile = 256;  // image_seq_length: feature tokens per tile after pixel shuffle
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};  // ImageNet's, as the -hf checkpoints set them
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
};

struct TileGrid {
  int64_t columns;
  int64_t rows;
};

// The grid an image of height x width is tiled on: among the grids of min_tiles..max_tiles tiles, the
// one whose columns/rows is closest to width/height. On an exact tie the later grid (more tiles) wins
// while the image's area is more than half the tiles' area. ConfigError when the options are invalid,
// DataError when a side is not positive.
TileGrid internvl_tile_grid(int64_t height, int64_t width, const InternVLImageOptions& options = {});

// One image -> pixel_values (tiles [+ thumbnail], 3, tile, tile) float32: the image resized (Pillow
// bicubic) to (tile*rows, tile*columns) and cut row-major, then, when there is more than one tile, the
// original image resized to tile x tile. grid_thw = (patches, tile/patch, tile/patch) with patches the
// tiles and thumbnail together; tokens = patches * tokens_per_tile.
data::VisionInput internvl_process_image(const data::Image& image, const InternVLImageOptions& options = {});

// InternVLProcessor as the data path uses it: images as <img>, the tiles' <IMG_CONTEXT>, </img>; no
// default system message (the -hf chat template writes none).
class InternVLImageProcessor : public data::ImageProcessor {
 public:
  // ConfigError when the options are invalid.
  explicit InternVLImageProcessor(const InternVLImageOptions& options);
  data::VisionInput process(const data::Image& image) const override {
    return internvl_process_image(image, options_);
  }
  const data::ImageBlock& block() const override;
  // Always ConfigError: InternVL tiles every image to a fixed tile size, so pixel bounds do not apply.
  void set_pixel_bounds(int64_t min_pixels, int64_t max_pixels) override;
  // One tile per image (max_tiles 1): a square is resized to the tile size whole.
  void set_square_images(int64_t side) override;
  int64_t size_multiple() const override { return 1; }
  // GotOcr2ImageProcessor's settings as the -hf checkpoints write them, with crop_to_patches true (Loom
  // always tiles; transformers' InternVLProcessor turns it on per call).
  nlohmann::ordered_json preprocessor_config() const override;
  // InternVLProcessor with image_seq_length (tokens per tile).
  nlohmann::ordered_json processor_config() const override;
  // <img>, </img>, <IMG_CONTEXT> and <video> by the names InternVLProcessor reads them.
  nlohmann::ordered_json named_tokens() const override;
  const std::string& default_system() const override;
  const InternVLImageOptions& options() const { return options_; }

 private:
  InternVLImageOptions options_;
};

}  // namespace loom::models
