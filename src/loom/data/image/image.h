// An 8-bit RGB image in memory, the unit every image decoder produces and every image
// processor consumes.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct Image {
  int height = 0;
  int width = 0;
  std::vector<uint8_t> rgb;  // (height, width, 3), row-major

  uint8_t* pixel(int y, int x) { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
  const uint8_t* pixel(int y, int x) const { return rgb.data() + (static_cast<size_t>(y) * width + x) * 3; }
  static Image filled(int height, int width, uint8_t r, uint8_t g, uint8_t b) {
    Image image{height, width, std::vector<uint8_t>(static_cast<size_t>(height) * width * 3)};
    for (size_t i = 0; i < image.rgb.size(); i += 3) {
      image.rgb[i] = r;
      image.rgb[i + 1] = g;
      image.rgb[i + 2] = b;
    }
    return image;
  }
  // Mirrors the image left-right in place.
  void flip_horizontal() {
    for (int y = 0; y < height; ++y)
      for (int x = 0, mirror = width - 1; x < mirror; ++x, --mirror)
        std::swap_ranges(pixel(y, x), pixel(y, x) + 3, pixel(y, mirror));
  }
  // Moves the content dx pixels right and dy pixels down (negative: left, up) in place; the
  // uncovered border repeats the nearest edge pixel, so a uniform background stays uniform.
  void translate(int dx, int dy) {
    const Image source = *this;
    for (int y = 0; y < height; ++y) {
      const int sy = std::clamp(y - dy, 0, height - 1);
      for (int x = 0; x < width; ++x) {
        const int sx = std::clamp(x - dx, 0, width - 1);
        std::copy(source.pixel(sy, sx), source.pixel(sy, sx) + 3, pixel(y, x));
      }
    }
  }
};

}  // namespace loom::data
