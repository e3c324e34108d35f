// The safetensors weight format (HuggingFace's): a reader over a memory-mapped file, a
// crash-safe writer, and a view of a HuggingFace model directory (single file or sharded).
//
// File layout: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// (padded with spaces to a multiple of 8), then the tensor bytes; offsets count from the first
// byte after the header and tile the data region without gaps.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::checkpoint {

// The dtypes Loom reads and writes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
std::string safetensors_dtype_name(at::ScalarType dtype);  // CheckpointError if not one of them
bool is_safetensors_dtype(at::ScalarType dtype);

// Read-only view of one safetensors file. The file is mapped once at construction and the
// header fully validated then; copies of a reader share the mapping.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);

  const std::string& path() const { return path_; }
  // Tensor names in the order their bytes appear in the file.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  // Size in bytes of the stored tensor.
  size_t nbytes(const std::string& name) const;
  // A new contiguous CPU tensor that owns its memory, in the stored dtype.
  at::Tensor load(const std::string& name) const;
  // Rows [begin, end) of its first dimension, copied alone (a slice of a large tensor without reading
  // the rest). CheckpointError for a tensor of no dimensions or rows out of range.
  at::Tensor load_rows(const std::string& name, int64_t begin, int64_t end) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  struct Entry {
    at::ScalarType dtype;
    std::vector<int64_t> shape;
    size_t begin;  // relative to the start of the data region
    size_t end;
  };
  struct Mapping;

  const Entry& entry(const std::string& name) const;

  std::string path_;
  std::shared_ptr<const Mapping> mapping_;
  const uint8_t* data_ = nullptr;  // first byte after the header, inside mapping_
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (any device, dtype from the list above, any strides) in the given order to
// `path` through a temporary file + fsync + rename: `path` is never left half-written.
// Duplicate or empty names and the reserved name "__metadata__" are CheckpointErrors.
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Whether a tensor stored as `stored` may be copied into one of `target`: floating point into floating
// point (the model's precision decides the width) and integers (or bool) into integers, never across:
// the numbers would be of another kind (a float tensor mislabelled I32 would load as huge integers).
bool loadable_as(at::ScalarType stored, at::ScalarType target);

// The weights of a HuggingFace model directory: `model.safetensors` if present (as transformers
// prefers it), else `model.safetensors.index.json`, whose `weight_map` sends each name to a shard.
class WeightSource {
 public:
  explicit WeightSource(const std::string& directory);

  const std::string& directory() const { return directory_; }
  // All tensor names, sorted.
  std::vector<std::string> names() const;
  bool contains(const std::string& name) const;
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  at::Tensor load(const std::string& name) const;
  // Rows [begin, end) of its first dimension, copied alone (a slice of a large tensor without reading
  // the rest). CheckpointError for a tensor of no dimensions or rows out of range.
  at::Tensor load_rows(const std::string& name, int64_t begin, int64_t end) const;
  // The file that holds `name`.
  const std::string& file_of(const std::string& name) const;

 private:
  const SafetensorsReader& reader_of(const std::string& name) const;

  std::string directory_;
  std::vector<SafetensorsReader> shards_;
  std::map<std::string, size_t> shard_of_;  // name -> index into shards_
};

}  // namespace loom::checkpoint
