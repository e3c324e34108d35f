// PNG decoding through libpng's classic API (its setjmp confined to small frames that
// own no C++ objects), JPEG decoding through TurboJPEG.
#include "loom/data/image/decode.h"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::data {
namespace {

// The most encoded bytes an image file may have: far beyond any photo, short of a device or a stray
// disk image read whole into memory.
constexpr uint64_t kMaxImageFileBytes = uint64_t{1} << 30;

constexpr uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
constexpr uint8_t kJpegMagic[3] = {0xFF, 0xD8, 0xFF};

bool starts_with(const uint8_t* data, size_t size, const uint8_t* magic, size_t magic_size) {
  return size >= magic_size && std::memcmp(data, magic, magic_size) == 0;
}

// Checked on the header's size, before any pixel is allocated.
void check_pixel_budget(const char* format, const std::string& name, uint64_t width, uint64_t height) {
  if (width * height > kMaxImagePixels)
    throw DataError(
        fmt::format("cannot decode {} {}: its header declares {}x{} = {} pixels, more than the {} "
                    "an image may have (a corrupt file or a decompression bomb)",
                    format, name, width, height, width * height, kMaxImagePixels));
}

// State shared with libpng's callbacks: the input bytes and the last error message.
struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t position;
  char message[256];
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t count) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (count > source->size - source->position) png_error(png, "unexpected end of data (truncated file)");
  std::memcpy(out, source->data + source->position, count);
  source->position += count;
}

void png_record_error(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->message, sizeof(source->message), "%s", message);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

// The two functions below call libpng, which reports errors by longjmp to the setjmp here. They
// own no objects with destructors, so the jump skips nothing; they return false on error.
bool png_read_header(png_structp png, png_infop info, png_uint_32* width, png_uint_32* height,
                     int* channels) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info);
  const int bit_depth = png_get_bit_depth(png, info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  // Keep the high byte of 16-bit samples, as PIL does for 16-bit RGB(A) and grey+alpha.
  if (bit_depth == 16) png_set_strip_16(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  *width = png_get_image_width(png, info);
  *height = png_get_image_height(png, info);
  *channels = png_get_channels(png, info);
  return png_get_bit_depth(png, info) == 8;
}

bool png_read_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

// Owns the libpng read structures for the duration of one decode.
struct PngReader {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ~PngReader() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
};

Image decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngSource source{data, size, 0, {0}};
  PngReader reader;
  reader.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_record_error, png_ignore_warning);
  if (!reader.png) throw DataError("cannot decode PNG " + name + ": libpng initialisation failed");
  reader.info = png_create_info_struct(reader.png);
  if (!reader.info) throw DataError("cannot decode PNG " + name + ": libpng initialisation failed");
  png_set_read_fn(reader.png, &source, png_read_from_memory);

  png_uint_32 width = 0, height = 0;
  int channels = 0;
  if (!png_read_header(reader.png, reader.info, &width, &height, &channels) || source.message[0]) {
    throw DataError("cannot decode PNG " + name + ": " +
                    (source.message[0] ? source.message : "unsupported sample depth"));
  }
  if (width == 0 || height == 0 || channels < 1 || channels > 4) {
    throw DataError("cannot decode PNG " + name + ": unsupported size " + std::to_string(width) + "x" +
                    std::to_string(height) + " with " + std::to_string(channels) + " channels");
  }
  check_pixel_budget("PNG", name, width, height);

  // rows (height, width, channels) after libpng's expansions: 1 grey, 2 grey+alpha, 3 RGB, 4 RGBA.
  std::vector<uint8_t> decoded(static_cast<size_t>(height) * width * channels);
  std::vector<png_bytep> rows(height);
  for (png_uint_32 y = 0; y < height; ++y)
    rows[y] = decoded.data() + static_cast<size_t>(y) * width * channels;
  if (!png_read_rows(reader.png, rows.data())) {
    throw DataError("cannot decode PNG " + name + ": " + source.message);
  }

  Image image{static_cast<int>(height), static_cast<int>(width),
              std::vector<uint8_t>(static_cast<size_t>(height) * width * 3)};
  const size_t pixels = static_cast<size_t>(height) * width;
  for (size_t i = 0; i < pixels; ++i) {
    const uint8_t* in = decoded.data() + i * channels;
    uint8_t* out = image.rgb.data() + i * 3;
    if (channels <= 2) {
      out[0] = out[1] = out[2] = in[0];
    } else {
      out[0] = in[0];
      out[1] = in[1];
      out[2] = in[2];
    }
  }
  return image;
}

// Owns a TurboJPEG decompressor.
struct JpegDecompressor {
  tjhandle handle = tjInitDecompress();
  ~JpegDecompressor() {
    if (handle) tjDestroy(handle);
  }
};

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name) {
  JpegDecompressor decompressor;
  if (!decompressor.handle)
    throw DataError("cannot decode JPEG " + name + ": TurboJPEG initialisation failed");
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(decompressor.handle, data, static_cast<unsigned long>(size), &width, &height,
                          &subsampling, &colorspace) != 0) {
    throw DataError("cannot decode JPEG " + name + ": " + tjGetErrorStr2(decompressor.handle));
  }
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK) {
    throw DataError("cannot decode JPEG " + name +
                    ": CMYK/YCCK JPEGs are not supported (use RGB or greyscale)");
  }
  if (width <= 0 || height <= 0) {
    throw DataError("cannot decode JPEG " + name +
                    ": no image size in the header (truncated or corrupt file)");
  }
  check_pixel_budget("JPEG", name, static_cast<uint64_t>(width), static_cast<uint64_t>(height));
  Image image{height, width, std::vector<uint8_t>(static_cast<size_t>(height) * width * 3)};
  // Default flags: accurate integer DCT and smooth chroma upsampling, as PIL decodes. Warnings
  // (such as premature end of data) count as errors, as PIL refuses truncated images.
  if (tjDecompress2(decompressor.handle, data, static_cast<unsigned long>(size), image.rgb.data(), width, 0,
                    height, TJPF_RGB, 0) != 0) {
    throw DataError("cannot decode JPEG " + name + ": " + tjGetErrorStr2(decompressor.handle));
  }
  return image;
}

}  // namespace

Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors) {
  if (starts_with(data, size, kPngMagic, sizeof(kPngMagic))) return decode_png(data, size, name_for_errors);
  if (starts_with(data, size, kJpegMagic, sizeof(kJpegMagic)))
    return decode_jpeg(data, size, name_for_errors);
  throw DataError("cannot decode image " + name_for_errors + ": not a PNG or JPEG file (" +
                  std::to_string(size) + " bytes, unrecognised signature)");
}

Image decode_image_file(const std::string& path) {
  // Only regular files of a bounded size are read: a directory, a device such as /dev/zero or a
  // pipe is no image.
  if (const std::string why = unreadable_file_reason(path); !why.empty())
    throw DataError(fmt::format("cannot read image file {}: it {}", path, why));
  std::error_code error;
  const uint64_t size = std::filesystem::file_size(path, error);
  if (error) throw DataError(fmt::format("cannot read image file {}: {}", path, error.message()));
  if (size > kMaxImageFileBytes)
    throw DataError(
        fmt::format("cannot read image file {}: {} bytes, more than the {} an image file may have", path,
                    size, kMaxImageFileBytes));
  std::ifstream file(path, std::ios::binary);
  if (!file) throw DataError("cannot open image file " + path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  file.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size));
  if (file.bad() || file.gcount() != static_cast<std::streamsize>(size))
    throw DataError(
        fmt::format("cannot read image file {}: read {} of its {} bytes", path, file.gcount(), size));
  return decode_image_bytes(bytes.data(), bytes.size(), path);
}

void encode_png_file(const Image& image, const std::string& path) {
  if (image.height <= 0 || image.width <= 0 ||
      image.rgb.size() != static_cast<size_t>(image.height) * image.width * 3) {
    throw DataError("cannot write PNG " + path + ": image is " + std::to_string(image.height) + "x" +
                    std::to_string(image.width) + " with " + std::to_string(image.rgb.size()) +
                    " bytes (expected height*width*3 bytes, both sides positive)");
  }
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(image.width);
  png.height = static_cast<png_uint_32>(image.height);
  png.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&png, path.c_str(), 0, image.rgb.data(), 0, nullptr)) {
    const std::string message = png.message;
    png_image_free(&png);
    throw DataError("cannot write PNG " + path + ": " + message);
  }
}

}  // namespace loom::data
