// Checks InternVL's image processor: the tile grid on the worked examples of transformers'
// GotOcr2 grid choice, and grids, patches, tokens and pixel_values against the reference processor's
// output for the tiny fixture's images (28-px tiles) and for a synthetic image at 448-px tiles.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "loom/data/chat_template.h"
#include "loom/data/image/decode.h"
#include "loom/models/internvl/processor.h"
#include "loom/util/errors.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/internvl-tiny";

// The grid for a width x height image (the order the worked examples are written in).
void expect_grid(int64_t width, int64_t height, int64_t columns, int64_t rows) {
  const TileGrid grid = internvl_tile_grid(height, width, InternVLImageOptions{});
  EXPECT_EQ(grid.columns, columns) << width << "x" << height << " (width x height)";
  EXPECT_EQ(grid.rows, rows) << width << "x" << height << " (width x height)";
}

TEST(InternVLTileGrid, WorkedExamples) {
  expect_grid(448, 448, 1, 1);  // ties with (2,2): 448^2 is not more than half of 4 tiles
  expect_grid(896, 448, 2, 1);
  expect_grid(1344, 896, 3, 2);
  expect_grid(800, 800, 2, 2);  // the (2,2) tie is won, (3,3) is not
  expect_grid(640, 480, 4, 3);
  expect_grid(1920, 1080, 4, 2);  // tied with (2,1), the larger wins
  expect_grid(1000, 300, 3, 1);
  expect_grid(300, 1000, 1, 3);
  expect_grid(100, 2000, 1, 12);
}

TEST(InternVLTileGrid, RespectsTileBounds) {
  InternVLImageOptions options;
  options.min_tiles = 2;
  options.max_tiles = 4;
  const TileGrid square = internvl_tile_grid(448, 448, options);  // (1,1) is out: (2,2) is the best fit
  EXPECT_EQ(square.columns, 2);
  EXPECT_EQ(square.rows, 2);
  options.min_tiles = options.max_tiles = 1;
  const TileGrid wide = internvl_tile_grid(100, 2000, options);
  EXPECT_EQ(wide.columns, 1);
  EXPECT_EQ(wide.rows, 1);
}

TEST(InternVLTileGrid, RejectsBadSizesAndOptions) {
  EXPECT_THROW(internvl_tile_grid(0, 10), DataError);
  InternVLImageOptions options;
  options.patch_size = 15;  // 448 is not a multiple
  EXPECT_THROW(internvl_tile_grid(10, 10, options), ConfigError);
  options = {};
  options.min_tiles = 3;
  options.max_tiles = 2;
  EXPECT_THROW(InternVLImageProcessor{options}, ConfigError);
}

// img_6tiles's thumbnail (60x40 to 28x28) is a resize that Pillow 13 runs vertical pass first.
TEST(InternVLImageProcessor, MatchesReferenceOnFixtureImages) {
  const testing::ReferenceFixture inputs(kFixture + "/inputs", "internvl processor");
  const nlohmann::json expected = inputs.json("inputs.json");
  const nlohmann::json& settings = expected.at("image_processor");
  InternVLImageOptions options;
  options.tile_size = settings.at("size").at("height").get<int64_t>();
  options.patch_size = 7;
  options.min_tiles = settings.at("min_patches").get<int64_t>();
  options.max_tiles = settings.at("max_patches").get<int64_t>();
  options.tokens_per_tile = expected.at("image_seq_length").get<int64_t>();
  const InternVLImageProcessor processor(options);
  ASSERT_EQ(expected.at("images").size(), 3u);
  for (const auto& [name, image] : expected.at("images").items()) {
    SCOPED_TRACE(name);
    const data::Image decoded =
        data::decode_image_file(inputs.dir() + "/" + image.at("file").get<std::string>());
    const auto size_hw = image.at("size_hw").get<std::vector<int64_t>>();
    ASSERT_EQ(decoded.height, size_hw[0]);
    ASSERT_EQ(decoded.width, size_hw[1]);

    const auto columns_rows = image.at("grid_cols_rows").get<std::vector<int64_t>>();
    const TileGrid grid = internvl_tile_grid(decoded.height, decoded.width, options);
    EXPECT_EQ(grid.columns, columns_rows[0]);
    EXPECT_EQ(grid.rows, columns_rows[1]);

    const data::VisionInput out = processor.process(decoded);
    const int64_t patches = image.at("num_patches").get<int64_t>();
    EXPECT_EQ(out.grid_thw[0], patches);
    EXPECT_EQ(out.grid_thw[1], 4);  // 28 / 7
    EXPECT_EQ(out.grid_thw[2], 4);
    EXPECT_EQ(out.tokens, patches * options.tokens_per_tile);
    const at::Tensor reference = inputs.f32(image.at("pixel_values").get<std::string>(),
                                            image.at("pixel_values_shape").get<std::vector<int64_t>>());
    EXPECT_LE(inputs.max_abs_diff(name + " pixel_values", out.pixel_values, reference), 1e-5);
  }
}

// A synthetic 1344x896 (width x height) image at the real 448-px tiles (R a horizontal ramp, G a vertical
// ramp, B (x + y) mod 256): 3x2 tiles and the thumbnail; values from transformers' GotOcr2ImageProcessorPil.
TEST(InternVLImageProcessor, MatchesReferenceAt448Pixels) {
  const int width = 1344, height = 896;
  data::Image image{height, width, std::vector<uint8_t>(static_cast<size_t>(height) * width * 3)};
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      uint8_t* px = image.pixel(y, x);
      px[0] = static_cast<uint8_t>(x * 255 / (width - 1));
      px[1] = static_cast<uint8_t>(y * 255 / (height - 1));
      px[2] = static_cast<uint8_t>((x + y) % 256);
    }
  }
  const data::VisionInput out = internvl_process_image(image);
  ASSERT_EQ(out.pixel_values.sizes(), (at::IntArrayRef{7, 3, 448, 448}));
  EXPECT_EQ(out.grid_thw, (std::array<int64_t, 3>{7, 32, 32}));
  EXPECT_EQ(out.tokens, 7 * 256);
  const at::Tensor first = out.pixel_values.index({0, at::indexing::Slice(), 0, 0});
  const at::Tensor thumbnail = out.pixel_values.index({6, at::indexing::Slice(), 447, 447});
  EXPECT_TRUE(at::allclose(first, at::tensor({-2.117904f, -2.0357141f, -1.8044444f}), 0, 1e-6)) << first;
  EXPECT_TRUE(at::allclose(thumbnail, at::tensor({2.2317834f, 2.4110641f, 1.4722441f}), 0, 1e-6))
      << thumbnail;
  EXPECT_NEAR(out.pixel_values.to(at::kDouble).mean().item<double>(), 0.219958, 1e-6);
}

TEST(InternVLImageProcessor, OneTileHasNoThumbnail) {
  const data::Image image = data::Image::filled(448, 448, 255, 0, 0);
  const data::VisionInput out = internvl_process_image(image);
  EXPECT_EQ(out.pixel_values.sizes(), (at::IntArrayRef{1, 3, 448, 448}));
  EXPECT_EQ(out.grid_thw, (std::array<int64_t, 3>{1, 32, 32}));
  EXPECT_EQ(out.tokens, 256);
}

// The built-in sets' square images are taken whole: one tile, where a large square would be cut into
// 3 x 3 (a 1000-pixel square is more than half the area of nine 448-pixel tiles).
TEST(InternVLImageProcessor, SquareImagesAreOneTile) {
  const data::Image image = data::Image::filled(1000, 1000, 0, 255, 0);
  InternVLImageProcessor processor({});
  EXPECT_EQ(processor.process(image).grid_thw[0], 10);  // 3 x 3 tiles and the thumbnail
  processor.set_square_images(1000);
  const data::VisionInput out = processor.process(image);
  EXPECT_EQ(out.pixel_values.sizes(), (at::IntArrayRef{1, 3, 448, 448}));
  EXPECT_EQ(out.tokens, 256);
  EXPECT_EQ(processor.preprocessor_config()["max_patches"], 1);
}

TEST(InternVLImageProcessor, TextBlockAndSettings) {
  InternVLImageProcessor processor(InternVLImageOptions{});
  EXPECT_EQ(processor.block().start, "<img>");
  EXPECT_EQ(processor.block().pad, "<IMG_CONTEXT>");
  EXPECT_EQ(processor.block().end, "</img>");
  // transformers' chat template writes an image as <IMG_CONTEXT>, which its processor expands.
  EXPECT_EQ(processor.block().template_text(), "<IMG_CONTEXT>");
  EXPECT_EQ(data::chatml_template_jinja("", processor.block()).find("<img>"), std::string::npos);
  EXPECT_EQ(processor.default_system(), "");
  EXPECT_EQ(processor.size_multiple(), 1);
  const std::string message =
      testing::message_of<ConfigError>([&] { processor.set_pixel_bounds(3136, 1003520); });
  EXPECT_NE(message.find("data.min_pixels"), std::string::npos) << message;
  EXPECT_NE(message.find("448x448"), std::string::npos) << message;
}

TEST(InternVLImageProcessor, ConfigIsTheCheckpointsWithTilingOn) {
  // The fixture's processor_config.json, as transformers 5.25 saved it, with the tiling InternVLProcessor
  // turns on per call written into it.
  const testing::ReferenceFixture checkpoint(kFixture + "/qwen2", "internvl processor");
  nlohmann::json expected = checkpoint.json("processor_config.json").at("image_processor");
  expected["crop_to_patches"] = true;
  InternVLImageOptions options;
  options.tile_size = 28;
  options.patch_size = 7;
  options.tokens_per_tile = 4;
  const nlohmann::json actual = InternVLImageProcessor(options).preprocessor_config();
  EXPECT_EQ(actual, expected) << actual.dump(2);
}

}  // namespace
}  // namespace loom::models
