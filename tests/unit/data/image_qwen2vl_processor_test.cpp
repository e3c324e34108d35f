// Checks Qwen2-VL image preprocessing: smart_resize on hand-worked sizes, the patch-row layout on a
// position-coded image, and pixel_values against HuggingFace's processor output.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/image/decode.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

std::string fixture(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/" + name;
}

std::vector<float> read_floats(const std::string& path, size_t count) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  std::vector<float> values(count);
  file.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * sizeof(float)));
  EXPECT_EQ(static_cast<size_t>(file.gcount()), count * sizeof(float)) << path;
  return values;
}

void expect_size(GridSize size, int64_t height, int64_t width) {
  EXPECT_EQ(size.height, height);
  EXPECT_EQ(size.width, width);
}

TEST(SmartResize, MultiplesOfFactorAreKept) {
  expect_size(smart_resize(56, 84), 56, 84);
  expect_size(smart_resize(448, 448), 448, 448);
}

TEST(SmartResize, RoundsHalfToEven) {
  // 42/28 = 1.5 -> 2, 70/28 = 2.5 -> 2 (half to even, as Python's round): 56x56 = min_pixels exactly.
  expect_size(smart_resize(42, 70), 56, 56);
  // 100/28 = 3.57 -> 4, 200/28 = 7.14 -> 7.
  expect_size(smart_resize(100, 200), 112, 196);
}

TEST(SmartResize, ShrinksToMaxPixels) {
  // 1988x2996 > 1003520: beta = sqrt(2000*3000/1003520) = 2.44519; 2000/beta/28 = 29.21 -> 29,
  // 3000/beta/28 = 43.82 -> 43.
  expect_size(smart_resize(2000, 3000), 29 * 28, 43 * 28);
  // 1080x1920: 1092x1932 > max; beta = 1.43747; 26.83 -> 26, 47.70 -> 47.
  expect_size(smart_resize(1080, 1920), 26 * 28, 47 * 28);
}

TEST(SmartResize, GrowsToMinPixels) {
  // 30x40 rounds to 28x28 < 3136: beta = sqrt(3136/1200) = 1.61658; 30*beta/28 = 1.73 -> 2,
  // 40*beta/28 = 2.31 -> 3.
  expect_size(smart_resize(30, 40), 56, 84);
}

TEST(SmartResize, SidesAreAtLeastOneFactor) {
  // 10/28 rounds to 0, clamped to 28; 1000/28 = 35.7 -> 36.
  expect_size(smart_resize(10, 1000), 28, 36 * 28);
  expect_size(smart_resize(1, 200), 28, 7 * 28);
  // max_pixels 7840: beta = sqrt(60000/7840) = 2.76642; 20/beta/28 = 0.26 -> 0 -> 28,
  // 3000/beta/28 = 38.73 -> 38.
  expect_size(smart_resize(20, 3000, 28, 3136, 7840), 28, 38 * 28);
}

TEST(SmartResize, RejectsExtremeAspectRatioAndEmptySides) {
  EXPECT_THROW(smart_resize(1, 201), DataError);
  EXPECT_THROW(smart_resize(3000, 14), DataError);
  EXPECT_THROW(smart_resize(0, 10), DataError);
}

TEST(Qwen2VLProcessor, MergedTokenCount) {
  EXPECT_EQ(merged_token_count({1, 32, 32}), 256);
  EXPECT_EQ(merged_token_count({1, 4, 6}), 6);
  EXPECT_EQ(merged_token_count({2, 4, 6}, 1), 48);
  EXPECT_THROW(merged_token_count({1, 3, 6}), DataError);
}

// With mean 0 and std 1 each value is its pixel / 255, so every element's position can be checked
// against the documented layout: rows grouped by 2x2 merge window, each row [C][T][14][14].
TEST(Qwen2VLProcessor, PatchRowLayout) {
  const int H = 56, W = 84, p = 14, m = 2, T = 2;
  Image image{H, W, std::vector<uint8_t>(H * W * 3)};
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < W; ++x)
      for (int c = 0; c < 3; ++c) image.pixel(y, x)[c] = static_cast<uint8_t>((y * 3 + x * 7 + c * 50) % 256);
  Qwen2VLImageOptions options;
  options.mean = {0.f, 0.f, 0.f};
  options.std = {1.f, 1.f, 1.f};
  const VisionInput input = qwen2vl_process_image(image, options);
  EXPECT_EQ(input.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  ASSERT_EQ(input.pixel_values.sizes(), (at::IntArrayRef{24, 1176}));
  ASSERT_EQ(input.pixel_values.scalar_type(), at::kFloat);
  const float* values = input.pixel_values.data_ptr<float>();
  const int windows_across = W / (p * m);
  for (int y = 0; y < H; ++y) {
    for (int x = 0; x < W; ++x) {
      const int window = (y / (p * m)) * windows_across + x / (p * m);
      const int row = (window * m + (y / p) % m) * m + (x / p) % m;
      for (int c = 0; c < 3; ++c) {
        const float expected = static_cast<float>(image.pixel(y, x)[c] / 255.0);
        for (int t = 0; t < T; ++t) {
          const int col = ((c * T + t) * p + y % p) * p + x % p;
          ASSERT_EQ(values[row * 1176 + col], expected)
              << "y=" << y << " x=" << x << " c=" << c << " t=" << t;
        }
      }
    }
  }
}

// The HuggingFace transformers 4.45.1 processor's output for the tiny-model fixture image.
TEST(Qwen2VLProcessor, MatchesHuggingFace) {
  const Image image = decode_image_file(fixture("hf-qwen2-vl-tiny/image.png"));
  const VisionInput input = qwen2vl_process_image(image);
  EXPECT_EQ(input.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  ASSERT_EQ(input.pixel_values.sizes(), (at::IntArrayRef{24, 1176}));
  const std::vector<float> expected = read_floats(fixture("hf-qwen2-vl-tiny/pixel_values.bin"), 24 * 1176);
  const at::Tensor reference = at::from_blob(const_cast<float*>(expected.data()), {24, 1176}, at::kFloat);
  EXPECT_LE((input.pixel_values - reference).abs().max().item<float>(), 1e-5f);
}

// An image that must be resized (37x53 -> 56x84), against the reference steps done in numpy and
// Pillow by tests/fixtures/image/make.py.
TEST(Qwen2VLProcessor, ResizedImageMatchesReferenceSteps) {
  const Image image = decode_image_file(fixture("image/src_noise.png"));
  const VisionInput input = qwen2vl_process_image(image);
  EXPECT_EQ(input.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  ASSERT_EQ(input.pixel_values.sizes(), (at::IntArrayRef{24, 1176}));
  const std::vector<float> expected = read_floats(fixture("image/qwen2vl_noise_pixel_values.bin"), 24 * 1176);
  const at::Tensor reference = at::from_blob(const_cast<float*>(expected.data()), {24, 1176}, at::kFloat);
  EXPECT_LE((input.pixel_values - reference).abs().max().item<float>(), 1e-5f);
}

TEST(Qwen2VLProcessor, LargeImageIsCappedByMaxPixels) {
  const Image image = Image::filled(1080, 1920, 10, 20, 30);
  const VisionInput input = qwen2vl_process_image(image);
  EXPECT_EQ(input.grid_thw, (std::array<int64_t, 3>{1, 52, 94}));  // 728/14, 1316/14
  EXPECT_EQ(input.pixel_values.size(0), 52 * 94);
  EXPECT_EQ(merged_token_count(input.grid_thw), 52 * 94 / 4);
  // A uniform image stays uniform through the resize: channel 0 is (10/255 - mean) / std everywhere.
  const float r = (static_cast<float>(10 / 255.0) - 0.48145466f) / 0.26862954f;
  EXPECT_EQ(input.pixel_values.select(1, 0).min().item<float>(), r);
  EXPECT_EQ(input.pixel_values.select(1, 0).max().item<float>(), r);
}

}  // namespace
}  // namespace loom::data

// A checkpoint's video frame bounds: written as transformers' video processor reads them, and read
// back from video_preprocessor_config.json, or from processor_config.json's "video_processor", which
// transformers prefers; without either, a frame has the image bounds.
TEST(Qwen2VLProcessor, VideoBoundsRoundTripThroughTheVideoProcessorsConfig) {
  const std::string dir = ::testing::TempDir() + "/qwen2vl_video_config";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const auto write = [&](const std::string& name, const nlohmann::ordered_json& json) {
    std::ofstream(dir + "/" + name) << json.dump();
  };
  loom::data::Qwen2VLImageOptions options;
  options.min_pixels = 3136;
  options.max_pixels = 6272;
  loom::data::Qwen2VLImageProcessor processor(options);
  write("preprocessor_config.json", processor.preprocessor_config());
  const loom::data::Qwen2VLImageOptions plain = loom::data::read_qwen2vl_image_options(dir, {});
  EXPECT_EQ(plain.video_min_pixels, 0);
  EXPECT_EQ(plain.video_max_pixels, 0);

  processor.set_video_pixel_bounds(0, 4704);
  const nlohmann::ordered_json video = processor.video_preprocessor_config();
  EXPECT_EQ(video["size"], (nlohmann::ordered_json{{"shortest_edge", 3136}, {"longest_edge", 4704}}));
  EXPECT_EQ(video["do_sample_frames"], false);
  write("video_preprocessor_config.json", video);
  const loom::data::Qwen2VLImageOptions read = loom::data::read_qwen2vl_image_options(dir, {});
  EXPECT_EQ(read.min_pixels, 3136);
  EXPECT_EQ(read.max_pixels, 6272);
  EXPECT_EQ(read.video_min_pixels, 3136);
  EXPECT_EQ(read.video_max_pixels, 4704);

  write("processor_config.json",
        {{"video_processor", {{"size", {{"shortest_edge", 1000}, {"longest_edge", 2000}}}}}});
  const loom::data::Qwen2VLImageOptions nested = loom::data::read_qwen2vl_image_options(dir, {});
  EXPECT_EQ(nested.video_min_pixels, 1000);
  EXPECT_EQ(nested.video_max_pixels, 2000);
  std::filesystem::remove_all(dir);
}
