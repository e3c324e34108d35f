// What the trainer, the parallel plan and the tasks see of a model, whatever its family: its
// parameters under HuggingFace names, its layers in forward order, the runner its layers go
// through, and its HuggingFace config.
//
// Layers are the units that FSDP shards, recompute and offload wrap, and pipeline stages are cut
// from: a layer is named by the path that prefixes its parameters' names (visual.blocks.3,
// model.layers.0). The model calls nn::run_block for each of its layers, so whichever runner the
// plan sets is in place without the model knowing it.
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "loom/nn/block_runner.h"

namespace loom::core {

using Layers = std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>;

class Model {
 public:
  virtual ~Model() = default;
  // The module holding every parameter, under its HuggingFace name.
  virtual torch::nn::Module& module() = 0;
  const torch::nn::Module& module() const { return const_cast<Model*>(this)->module(); }
  // The layers in the order a forward pass runs them.
  virtual Layers layers() const = 0;
  // Every layer runs through `runner` (null: directly).
  virtual void set_layer_runner(std::shared_ptr<nn::BlockRunner> runner) = 0;
  // The model's architecture as a HuggingFace config.json object.
  virtual nlohmann::json hf_config() const = 0;
  // Module paths a user may name in model.freeze, for the error that lists them.
  virtual std::vector<std::string> freeze_examples() const = 0;
};

}  // namespace loom::core
