// Decoding PNG and JPEG files into 8-bit RGB images (as PIL's open(...).convert("RGB") would), and
// writing PNGs for tools and tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "loom/data/image/image.h"

namespace loom::data {

// The most pixels an image may declare: PIL's MAX_IMAGE_PIXELS, beyond which it warns of a
// decompression bomb (an 8-bit RGB image of this size takes 256 MiB). Larger ones are corrupt images.
constexpr uint64_t kMaxImagePixels = 89'478'485;

// Reads and decodes a PNG or JPEG file (format detected from its first bytes). Alpha is dropped,
// grey and palette images are expanded to RGB, 16-bit samples keep their high byte.
// Throws DataError naming the file when it cannot be read, is not a regular file (a directory, a
// device), is of another format, declares more than kMaxImagePixels pixels, or is corrupt.
Image decode_image_file(const std::string& path);

// Same as decode_image_file for bytes already in memory; name_for_errors names them in messages.
Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name_for_errors);

// Writes an 8-bit RGB PNG. Throws DataError naming the file on failure.
void encode_png_file(const Image& image, const std::string& path);

}  // namespace loom::data
