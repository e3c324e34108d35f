// Checks resize_bicubic byte for byte against Pillow's Image.resize(..., BICUBIC) on fixtures
// written by tests/fixtures/image/make.py.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "loom/data/image/decode.h"
#include "loom/data/image/resize.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

std::string fixture(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/image/" + name;
}

TEST(ImageResize, MatchesPillowBicubicExactly) {
  // Up, down, mixed, one axis only, odd sizes, down to a single pixel.
  const std::pair<int, int> sizes[] = {{74, 106}, {20, 30}, {50, 25},  {37, 40}, {61, 53},
                                       {13, 7},   {3, 101}, {112, 84}, {1, 1}};
  for (const std::string source : {"noise", "edges"}) {
    const Image image = decode_image_file(fixture("src_" + source + ".png"));
    ASSERT_EQ(image.height, 37);
    ASSERT_EQ(image.width, 53);
    for (const auto& [h, w] : sizes) {
      const std::string name =
          "resize_" + source + "_" + std::to_string(h) + "x" + std::to_string(w) + ".png";
      SCOPED_TRACE(name);
      const Image expected = decode_image_file(fixture(name));
      const Image resized = resize_bicubic(image, h, w);
      ASSERT_EQ(resized.height, h);
      ASSERT_EQ(resized.width, w);
      EXPECT_EQ(resized.rgb, expected.rgb);
    }
  }
}

TEST(Image, FlipHorizontalMirrorsEachRow) {
  Image image{2, 3, {1, 1, 1, 2, 2, 2, 3, 3, 3, /**/ 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  image.flip_horizontal();
  EXPECT_EQ(image.rgb, (std::vector<uint8_t>{3, 3, 3, 2, 2, 2, 1, 1, 1, /**/ 10, 11, 12, 7, 8, 9, 4, 5, 6}));
  Image wide{1, 4, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}};
  wide.flip_horizontal();
  EXPECT_EQ(wide.rgb, (std::vector<uint8_t>{10, 11, 12, 7, 8, 9, 4, 5, 6, 1, 2, 3}));
}

// Worked by hand on a 3 x 3 image whose pixels are numbered 1..9 (all channels alike): the content
// moves, and the uncovered rows and columns repeat the nearest edge.
TEST(Image, TranslateMovesTheContentAndRepeatsTheEdge) {
  auto numbered = [] {
    Image image{3, 3, {}};
    for (uint8_t v = 1; v <= 9; ++v) image.rgb.insert(image.rgb.end(), {v, v, v});
    return image;
  };
  auto grey = [](std::vector<uint8_t> values) {
    std::vector<uint8_t> rgb;
    for (uint8_t v : values) rgb.insert(rgb.end(), {v, v, v});
    return rgb;
  };
  Image right_down = numbered();
  right_down.translate(1, 1);
  EXPECT_EQ(right_down.rgb, grey({1, 1, 2, 1, 1, 2, 4, 4, 5}));
  Image left = numbered();
  left.translate(-2, 0);
  EXPECT_EQ(left.rgb, grey({3, 3, 3, 6, 6, 6, 9, 9, 9}));
  Image up = numbered();
  up.translate(0, -1);
  EXPECT_EQ(up.rgb, grey({4, 5, 6, 7, 8, 9, 7, 8, 9}));
  Image still = numbered();
  still.translate(0, 0);
  EXPECT_EQ(still.rgb, numbered().rgb);
}

TEST(ImageResize, EqualSizeIsACopy) {
  const Image image = decode_image_file(fixture("src_noise.png"));
  const Image same = resize_bicubic(image, image.height, image.width);
  EXPECT_EQ(same.height, image.height);
  EXPECT_EQ(same.width, image.width);
  EXPECT_EQ(same.rgb, image.rgb);
}

// Weights are normalised to sum to one, and quantisation error is far below half a level, so a
// uniform image stays uniform at any size.
TEST(ImageResize, UniformImageStaysUniform) {
  const Image image = Image::filled(9, 14, 0, 137, 255);
  for (const auto& [h, w] : {std::pair{4, 5}, std::pair{30, 31}, std::pair{1, 40}}) {
    const Image resized = resize_bicubic(image, h, w);
    EXPECT_EQ(resized.rgb, Image::filled(h, w, 0, 137, 255).rgb) << h << "x" << w;
  }
}

TEST(ImageResize, RejectsBadSizes) {
  const Image image = Image::filled(4, 4, 1, 2, 3);
  EXPECT_THROW(resize_bicubic(image, 0, 4), DataError);
  EXPECT_THROW(resize_bicubic(image, 4, -1), DataError);
  EXPECT_THROW(resize_bicubic(Image{}, 4, 4), DataError);
}

}  // namespace
}  // namespace loom::data
