// loom export: a checkpoint as a weights-only HuggingFace model directory, in one dtype and sharded
// as transformers shards (checkpoint/hf_export.h).
#include <fmt/format.h>

#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/hf_export.h"
#include "loom/util/errors.h"

namespace loom::cli {

Command add_export(CLI::App& loom) {
  struct Arguments {
    std::string checkpoint, out, dtype, max_shard_size = "5GB";
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command = loom.add_subcommand("export",
                                      "Write a checkpoint as a HuggingFace model directory (weights, config, "
                                      "tokenizer and processor files; no "
                                      "optimizer state): loom export CHECKPOINT --out DIR");
  command
      ->add_option("checkpoint", arguments->checkpoint,
                   "Checkpoint or model directory, or a run directory (its newest checkpoint)")
      ->required();
  command->add_option("--out", arguments->out, "The new model directory")->required();
  command->add_option("--dtype", arguments->dtype, "bf16, fp16 or fp32 (default: as stored)");
  command->add_option("--max-shard-size", arguments->max_shard_size,
                      "Largest weights file, e.g. 5GB (default), 500MB, 2GiB; larger models are sharded");
  return {command, [arguments] {
            static const std::map<std::string, at::ScalarType> dtypes = {
                {"bf16", at::kBFloat16}, {"fp16", at::kHalf}, {"fp32", at::kFloat}};
            checkpoint::ExportOptions options;
            if (!arguments->dtype.empty()) {
              const auto it = dtypes.find(arguments->dtype);
              if (it == dtypes.end())
                throw ConfigError(
                    fmt::format("export: --dtype '{}' is not one of bf16, fp16, fp32", arguments->dtype));
              options.dtype = it->second;
            }
            options.max_shard_bytes =
                checkpoint::parse_byte_size(arguments->max_shard_size, "export: --max-shard-size");
            const std::string source = checkpoint::resolve_model_directory(arguments->checkpoint);
            const int64_t tensors = checkpoint::export_hf_directory(source, arguments->out, options);
            fmt::print("exported {} tensors of {} to {}\n", tensors, source, arguments->out);
            return 0;
          }};
}

}  // namespace loom::cli
