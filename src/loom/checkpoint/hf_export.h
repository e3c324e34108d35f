// A HuggingFace model directory written from a Loom checkpoint (or any model directory): the
// weights, cast to one dtype if asked and split into shards listed by model.safetensors.index.json
// as transformers writes them, config.json with the torch_dtype the weights now have, and the files
// transformers reads beside them (tokenizer, processor settings, chat template, generation
// config). The optimizer and training state stay behind.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::checkpoint {

// config.json's torch_dtype for tensors of `dtype`: "float32", "bfloat16", "float16", ...
std::string hf_torch_dtype(at::ScalarType dtype);

// A size such as "5GB" (decimal units: KB, MB, GB, TB), "2GiB" (binary: KiB, MiB, GiB, TiB) or
// "1048576" (bytes), as transformers' max_shard_size reads it; ConfigError naming `what` otherwise.
int64_t parse_byte_size(const std::string& text, const std::string& what);

// Writes `tensors` into directory `dir`: one model.safetensors when their bytes fit in
// max_shard_bytes, else shards model-00001-of-0000N.safetensors in the given order (a new shard
// whenever the next tensor would overflow the current one; a tensor larger than the limit gets one
// of its own) and model.safetensors.index.json mapping each name to its shard. Returns the file
// names written.
std::vector<std::string> save_sharded_safetensors(
    const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
    int64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {});

struct ExportOptions {
  std::optional<at::ScalarType> dtype;      // floating-point weights cast to it; none: as stored
  int64_t max_shard_bytes = 5'000'000'000;  // transformers' default, 5GB
};

// Writes the model directory `out` from `source` (a checkpoint or model directory), holding one
// shard's tensors in memory at a time: complete or not at all, and never over a directory that
// holds anything. Returns the number of tensors.
int64_t export_hf_directory(const std::string& source, const std::string& out, const ExportOptions& options);

}  // namespace loom::checkpoint
