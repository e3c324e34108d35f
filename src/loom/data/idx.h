// Reader for IDX files, the array format of the MNIST family of datasets, gzipped or plain.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

// An unsigned-byte IDX array: dims from outermost to innermost, data row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // product(dims) bytes
};

// Reads an IDX file of element type 0x08 (unsigned byte); a gzipped file is decompressed on the
// fly. Throws DataError naming the file for a missing or unreadable file, a bad magic, another
// element type, or a payload whose length differs from the one the dimensions give.
IdxArray read_idx(const std::string& path);

}  // namespace loom::data
