// IDX reading through zlib's gz* calls, which read gzipped and plain files alike.
#include "loom/data/idx.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

// Closes the gzFile however reading ends.
class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (file_ == nullptr) {
      throw DataError(fmt::format("idx file {} cannot be opened: {}", path, std::strerror(errno)));
    }
    gzbuffer(file_, 1 << 20);
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; fewer only at the end of the file.
  size_t read(uint8_t* out, size_t n) {
    size_t total = 0;
    while (total < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - total, 1u << 30));
      const int got = gzread(file_, out + total, chunk);
      if (got < 0) {
        int code = 0;
        std::string message = gzerror(file_, &code);
        // zlib prefixes its message with the path, which ours already names.
        if (message.rfind(path_ + ": ", 0) == 0) message.erase(0, path_.size() + 2);
        throw DataError(fmt::format("idx file {} is corrupt or unreadable: {}", path_, message));
      }
      if (got == 0) break;
      total += static_cast<size_t>(got);
    }
    return total;
  }

 private:
  std::string path_;
  gzFile file_;
};

std::string type_name(uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "short";
    case 0x0C:
      return "int";
    case 0x0D:
      return "float";
    case 0x0E:
      return "double";
    default:
      return "unknown";
  }
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    throw DataError(fmt::format("idx file {} does not exist or is not a regular file", path));
  }
  GzFile file(path);

  // Header: two zero bytes, the element type, the number of dimensions, then each dimension as a
  // big-endian uint32.
  uint8_t magic[4];
  const size_t magic_read = file.read(magic, 4);
  if (magic_read < 4) {
    throw DataError(
        fmt::format("idx file {} is truncated: expected a 4-byte magic, found {} bytes", path, magic_read));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    throw DataError(
        fmt::format("idx file {} has a bad magic {:02x} {:02x} {:02x} {:02x}: expected 00 00 <type> <dims>",
                    path, magic[0], magic[1], magic[2], magic[3]));
  }
  if (magic[2] != 0x08) {
    throw DataError(
        fmt::format("idx file {} has element type 0x{:02x} ({}); only 0x08 (unsigned byte) is supported",
                    path, magic[2], type_name(magic[2])));
  }
  const int ndims = magic[3];
  if (ndims == 0) throw DataError(fmt::format("idx file {} has 0 dimensions; expected at least 1", path));

  std::vector<uint8_t> sizes(4 * static_cast<size_t>(ndims));
  const size_t sizes_read = file.read(sizes.data(), sizes.size());
  if (sizes_read < sizes.size()) {
    throw DataError(fmt::format("idx file {} is truncated: expected {} bytes of dimension sizes, found {}",
                                path, sizes.size(), sizes_read));
  }
  IdxArray array;
  uint64_t expected = 1;
  for (int d = 0; d < ndims; ++d) {
    const uint8_t* b = sizes.data() + 4 * d;
    const uint64_t size = (uint64_t{b[0]} << 24) | (uint64_t{b[1]} << 16) | (uint64_t{b[2]} << 8) | b[3];
    array.dims.push_back(static_cast<int64_t>(size));
    // Each factor is below 2^32, so checking before each multiply keeps the product exact.
    if (size != 0 && expected > (uint64_t{1} << 40) / size) {
      throw DataError(
          fmt::format("idx file {} declares more than 2^40 elements; dimension {} is {}", path, d, size));
    }
    expected *= size;
  }

  array.data.resize(static_cast<size_t>(expected));
  const size_t payload_read = file.read(array.data.data(), array.data.size());
  if (payload_read < array.data.size()) {
    throw DataError(fmt::format("idx file {} is truncated: dimensions [{}] give {} payload bytes, found {}",
                                path, fmt::join(array.dims, ", "), expected, payload_read));
  }
  uint8_t extra[4096];
  size_t trailing = 0;
  for (size_t got; (got = file.read(extra, sizeof(extra))) > 0;) trailing += got;
  if (trailing > 0) {
    throw DataError(
        fmt::format("idx file {} has {} bytes after the payload: dimensions [{}] give {} payload bytes", path,
                    trailing, fmt::join(array.dims, ", "), expected));
  }
  return array;
}

}  // namespace loom::data
