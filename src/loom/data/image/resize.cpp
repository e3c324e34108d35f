// Pillow-exact separable bicubic resampling. Each output sample is a weighted sum of a window of
// input samples; weights are computed in double, normalised to sum to one, then quantised.
#include "loom/data/image/resize.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

// Fixed-point weights: 8 bits of sample, 2 bits of headroom for the kernel's negative lobes and
// sums above one, in a 32-bit accumulator.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr double kSupport = 2.0;  // bicubic kernel is non-zero on (-2, 2)

double bicubic_kernel(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// For each output index, the first input index of its window and the quantised weights over it.
struct Taps {
  int window = 0;               // weights per output index (the widest window)
  std::vector<int> first;       // (out_size)
  std::vector<int> count;       // (out_size) inputs actually used, <= window
  std::vector<int32_t> weight;  // (out_size, window)
};

Taps compute_taps(int in_size, int out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);  // widen the kernel only when shrinking
  const double support = kSupport * filter_scale;
  Taps taps;
  taps.window = static_cast<int>(std::ceil(support)) * 2 + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weight.assign(static_cast<size_t>(out_size) * taps.window, 0);
  std::vector<double> w(taps.window);
  for (int o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    // Window bounds are rounded as Pillow does: truncate (value + 0.5) toward zero, then clamp.
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int n = hi - lo;
    double total = 0.0;
    for (int i = 0; i < n; ++i) {
      w[i] = bicubic_kernel((i + lo - center + 0.5) / filter_scale);
      total += w[i];
    }
    for (int i = 0; i < n; ++i) {
      const double normalised = total != 0.0 ? w[i] / total : w[i];
      const double fixed = normalised * (1 << kPrecisionBits);
      taps.weight[static_cast<size_t>(o) * taps.window + i] =
          static_cast<int32_t>(normalised < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps.first[o] = lo;
    taps.count[o] = n;
  }
  return taps;
}

uint8_t clip_fixed_point(int64_t sum) {
  const int64_t value = sum >> kPrecisionBits;  // floor division, as an arithmetic shift
  return static_cast<uint8_t>(std::clamp<int64_t>(value, 0, 255));
}

// in (height, in_width, 3) -> out (height, out_width, 3)
Image resample_rows(const Image& in, int out_width) {
  const Taps taps = compute_taps(in.width, out_width);
  Image out{in.height, out_width, std::vector<uint8_t>(static_cast<size_t>(in.height) * out_width * 3)};
  for (int y = 0; y < in.height; ++y) {
    for (int x = 0; x < out_width; ++x) {
      const int32_t* k = taps.weight.data() + static_cast<size_t>(x) * taps.window;
      const uint8_t* src = in.pixel(y, taps.first[x]);
      int64_t sum[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
      for (int i = 0; i < taps.count[x]; ++i) {
        for (int c = 0; c < 3; ++c) sum[c] += static_cast<int64_t>(src[i * 3 + c]) * k[i];
      }
      uint8_t* dst = out.pixel(y, x);
      for (int c = 0; c < 3; ++c) dst[c] = clip_fixed_point(sum[c]);
    }
  }
  return out;
}

// in (in_height, width, 3) -> out (out_height, width, 3)
Image resample_columns(const Image& in, int out_height) {
  const Taps taps = compute_taps(in.height, out_height);
  const size_t row_size = static_cast<size_t>(in.width) * 3;
  Image out{out_height, in.width, std::vector<uint8_t>(static_cast<size_t>(out_height) * row_size)};
  std::vector<int64_t> sum(row_size);
  for (int y = 0; y < out_height; ++y) {
    const int32_t* k = taps.weight.data() + static_cast<size_t>(y) * taps.window;
    std::fill(sum.begin(), sum.end(), int64_t{1} << (kPrecisionBits - 1));
    for (int i = 0; i < taps.count[y]; ++i) {
      const uint8_t* src = in.pixel(taps.first[y] + i, 0);
      for (size_t j = 0; j < row_size; ++j) sum[j] += static_cast<int64_t>(src[j]) * k[i];
    }
    uint8_t* dst = out.pixel(y, 0);
    for (size_t j = 0; j < row_size; ++j) dst[j] = clip_fixed_point(sum[j]);
  }
  return out;
}

}  // namespace

Image resize_bicubic(const Image& image, int out_height, int out_width) {
  if (image.height <= 0 || image.width <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.height) * image.width * 3) {
    throw DataError("resize_bicubic: input image is " + std::to_string(image.height) + "x" +
                    std::to_string(image.width) + " with " + std::to_string(image.rgb.size()) +
                    " bytes (expected positive sides and height*width*3 bytes)");
  }
  if (out_height <= 0 || out_width <= 0) {
    throw DataError("resize_bicubic: output size " + std::to_string(out_height) + "x" +
                    std::to_string(out_width) + " must be at least 1x1");
  }
  // The passes run in Pillow 13's order, which changes the rounding of the result: columns first when
  // the height shrinks by more than twice as many pixels as the width does, rows first otherwise.
  const bool columns_first =
      image.height > out_height && image.height - out_height > 2 * (image.width - out_width);
  Image result = image;
  if (!columns_first && out_width != image.width) result = resample_rows(result, out_width);
  if (out_height != image.height) result = resample_columns(result, out_height);
  if (columns_first && out_width != image.width) result = resample_rows(result, out_width);
  return result;
}

}  // namespace loom::data
