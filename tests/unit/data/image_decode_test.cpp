// Checks PNG/JPEG decoding against Pillow's own decoding (fixtures written by
// tests/fixtures/image/make.py) and that bad input fails with a DataError naming the file.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "data_test_util.h"
#include "loom/data/image/decode.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

using loom::test::message_of;
using loom::test::says_all;

std::string fixture(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/image/" + name;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << path;
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

// Expects decoding `name` to throw DataError whose message names `name`.
void expect_data_error_naming(const std::function<void()>& decode, const std::string& name) {
  EXPECT_TRUE(says_all(message_of(decode), {name}));
}

TEST(ImageDecode, RgbPngMatchesRawSourceBytes) {
  const Image image = decode_image_file(fixture("png_rgb.png"));
  EXPECT_EQ(image.height, 37);
  EXPECT_EQ(image.width, 53);
  EXPECT_EQ(image.rgb, read_bytes(fixture("src_noise.rgb")));
}

// Every colour type must decode to what Pillow's open(...).convert("RGB") gives.
TEST(ImageDecode, ColourTypesMatchPillowConvertRgb) {
  for (const std::string name : {"png_rgba", "png_gray", "png_gray_alpha", "png_palette", "png_palette_trns",
                                 "png_gray1", "png_rgba16"}) {
    SCOPED_TRACE(name);
    const Image image = decode_image_file(fixture(name + ".png"));
    const Image expected = decode_image_file(fixture("expected_" + name + ".png"));
    ASSERT_EQ(image.height, expected.height);
    ASSERT_EQ(image.width, expected.width);
    EXPECT_EQ(image.rgb, expected.rgb);
  }
}

// Pillow and TurboJPEG both use the system libjpeg-turbo with the accurate integer DCT and smooth
// upsampling, so the pixels agree exactly.
TEST(ImageDecode, JpegMatchesPillow) {
  for (const std::string name : {"jpeg_q95", "jpeg_gray_q95"}) {
    SCOPED_TRACE(name);
    const Image image = decode_image_file(fixture(name + ".jpg"));
    const Image expected = decode_image_file(fixture("expected_" + name + ".png"));
    ASSERT_EQ(image.height, 37);
    ASSERT_EQ(image.width, 53);
    EXPECT_EQ(image.rgb, expected.rgb);
  }
}

TEST(ImageDecode, BytesAndFileAgree) {
  const std::vector<uint8_t> bytes = read_bytes(fixture("jpeg_q95.jpg"));
  const Image from_bytes = decode_image_bytes(bytes.data(), bytes.size(), "jpeg_q95.jpg");
  EXPECT_EQ(from_bytes.rgb, decode_image_file(fixture("jpeg_q95.jpg")).rgb);
}

TEST(ImageDecode, TruncatedPngThrowsNamingFile) {
  const std::vector<uint8_t> bytes = read_bytes(fixture("png_rgb.png"));
  for (size_t keep : {size_t{8}, size_t{30}, bytes.size() / 2, bytes.size() - 20}) {
    SCOPED_TRACE(keep);
    expect_data_error_naming([&] { decode_image_bytes(bytes.data(), keep, "cut.png"); }, "cut.png");
  }
}

TEST(ImageDecode, CorruptPngThrowsNamingFile) {
  std::vector<uint8_t> bytes = read_bytes(fixture("png_rgb.png"));
  bytes[bytes.size() / 2] ^= 0x5A;  // inside the image data: its CRC no longer matches
  expect_data_error_naming([&] { decode_image_bytes(bytes.data(), bytes.size(), "flipped.png"); },
                           "flipped.png");
}

TEST(ImageDecode, TruncatedAndCorruptJpegThrowNamingFile) {
  const std::vector<uint8_t> bytes = read_bytes(fixture("jpeg_q95.jpg"));
  for (size_t keep : {size_t{3}, size_t{100}, bytes.size() / 2}) {
    SCOPED_TRACE(keep);
    expect_data_error_naming([&] { decode_image_bytes(bytes.data(), keep, "cut.jpg"); }, "cut.jpg");
  }
  // Garbage after the start-of-image marker.
  std::vector<uint8_t> garbage = {0xFF, 0xD8, 0xFF, 0x00, 0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC, 0xDE, 0xF0};
  expect_data_error_naming([&] { decode_image_bytes(garbage.data(), garbage.size(), "junk.jpg"); },
                           "junk.jpg");
}

TEST(ImageDecode, UnknownFormatAndMissingFileThrowNamingFile) {
  const std::string script = fixture("make.py");
  expect_data_error_naming([&] { decode_image_file(script); }, script);
  const uint8_t gif[] = {'G', 'I', 'F', '8', '9', 'a', 0, 0};
  expect_data_error_naming([&] { decode_image_bytes(gif, sizeof(gif), "anim.gif"); }, "anim.gif");
  expect_data_error_naming([&] { decode_image_bytes(gif, 0, "empty.png"); }, "empty.png");
  const std::string missing = fixture("does_not_exist.png");
  expect_data_error_naming([&] { decode_image_file(missing); }, missing);
}

// A PNG whose header declares width x height RGB pixels, followed by a few bytes of image data.
std::vector<uint8_t> png_declaring(uint32_t width, uint32_t height) {
  std::vector<uint8_t> bytes = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  auto put32 = [&bytes](uint32_t v) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<uint8_t>(v >> shift));
  };
  auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    put32(static_cast<uint32_t>(data.size()));
    const size_t start = bytes.size();
    bytes.insert(bytes.end(), type, type + 4);
    bytes.insert(bytes.end(), data.begin(), data.end());
    put32(static_cast<uint32_t>(crc32(0, bytes.data() + start, static_cast<uInt>(bytes.size() - start))));
  };
  std::vector<uint8_t> header;
  for (uint32_t v : {width, height})
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(v >> shift));
  header.insert(header.end(), {8, 2, 0, 0, 0});  // 8 bits, RGB, deflate, adaptive filters, no interlace
  chunk("IHDR", header);
  chunk("IDAT", {0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01});
  chunk("IEND", {});
  return bytes;
}

// Sizes a header declares are checked against a pixel budget before any pixel is allocated: a
// 65536x65536 PNG (12 GiB of RGB) ended in std::bad_alloc, where a corrupt image is skipped.
TEST(ImageDecode, HeadersDeclaringTooManyPixelsAreCorruptImages) {
  for (uint32_t side : {65536u, 40000u}) {
    const std::vector<uint8_t> bomb = png_declaring(side, side);
    const std::string name = "bomb" + std::to_string(side) + ".png";
    EXPECT_TRUE(
        says_all(message_of([&] { decode_image_bytes(bomb.data(), bomb.size(), name); }),
                 {name, std::to_string(side) + "x" + std::to_string(side), "more than the 89478485"}));
  }
  // Within the budget the same header is decoded, and fails only on its missing pixels.
  const std::vector<uint8_t> small = png_declaring(64, 64);
  EXPECT_FALSE(says_all(message_of([&] { decode_image_bytes(small.data(), small.size(), "small.png"); }),
                        {"more than the 89478485"}));
  // A JPEG's start-of-frame patched to 40000x40000.
  std::vector<uint8_t> jpeg = read_bytes(fixture("jpeg_q95.jpg"));
  size_t sof = 2;
  while (sof + 9 < jpeg.size() && !(jpeg[sof] == 0xFF && (jpeg[sof + 1] == 0xC0 || jpeg[sof + 1] == 0xC2)))
    ++sof;
  ASSERT_LT(sof + 9, jpeg.size());
  for (size_t at : {sof + 5, sof + 7}) {  // height, then width: 40000 = 0x9C40
    jpeg[at] = 0x9C;
    jpeg[at + 1] = 0x40;
  }
  EXPECT_TRUE(says_all(message_of([&] { decode_image_bytes(jpeg.data(), jpeg.size(), "bomb.jpg"); }),
                       {"bomb.jpg", "40000x40000", "more than the 89478485"}));
}

// A directory (std::ios_base::failure from deep inside the stream) and /dev/zero (read forever)
// are no images.
TEST(ImageDecode, DirectoriesAndDevicesAreNoImages) {
  const std::string dir = fixture("");
  EXPECT_TRUE(says_all(message_of([&] { decode_image_file(dir); }), {dir, "is a directory"}));
  EXPECT_TRUE(
      says_all(message_of([] { decode_image_file("/dev/zero"); }), {"/dev/zero", "is a special file"}));
}

TEST(ImageDecode, EncodePngRoundTrips) {
  const Image image{2, 3, {0, 1, 2, 3, 4, 5, 6, 7, 8, 250, 251, 252, 253, 254, 255, 9, 10, 11}};
  const std::string path = ::testing::TempDir() + "loom_image_encode_test.png";
  encode_png_file(image, path);
  const Image back = decode_image_file(path);
  std::remove(path.c_str());
  EXPECT_EQ(back.height, 2);
  EXPECT_EQ(back.width, 3);
  EXPECT_EQ(back.rgb, image.rgb);
}

TEST(ImageDecode, EncodeRejectsInconsistentImage) {
  const Image bad{2, 2, std::vector<uint8_t>(5)};
  expect_data_error_naming([&] { encode_png_file(bad, "bad_out.png"); }, "bad_out.png");
}

}  // namespace
}  // namespace loom::data
